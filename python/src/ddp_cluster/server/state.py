"""A server's actual state in one shell command: what site.yml's roles manage there, one digest per component.

The controller's warm path (``ddp_cluster_probe``) runs :func:`script` on every server at once, over one ssh
command each (or here, for nodes on the controller's own engine), and reads its output with :func:`parse`. No
module is uploaded and no Python is needed on the server: the script is POSIX sh, and a server lacking a tool
reports that tool's absence, which is a state like any other (it differs from the state recorded when the
server converged, so the server goes through the roles).

Components (each a section of the output, hashed here, so the same state gives the same digest):

- ``container``: the node container's specification label (its image id included), image and whether it runs;
- ``sshd``: whether the container's sshd listens on the cluster port;
- ``mesh``: sha256 and mode of the ssh mesh's files inside the container;
- ``slurm``: sha256 and mode of Slurm's settings and the munge key inside the container, which of munged,
  slurmd and slurmctld run there, and whether Slurm holds the node down as not responding;
- ``files``: sha256 of the node's settings file (node.env) and hosts file on the host;
- ``firewall``, ``sysctl``, ``packages`` (``host``): this cluster's ufw or firewalld rules, the kernel
  settings the roles write and the server's Python packages the Docker tasks need;
- ``hccn`` (``npu_devices``): each planned device's address, netdetect address and gateway (hccn_tool).

Standard library only, Python 3.8: this module ships alone, as the servers' module_utils do.
"""

from __future__ import annotations

import hashlib
import shlex
from typing import Any, Mapping

MARK = "::ddp-state::"
END = "end"

# The ssh mesh's files inside the node container (ssh_mesh writes them, ddp_node_container reads them too).
MESH_FILES = (
    "/root/.ssh/id_ddp_cluster",
    "/etc/ddp-cluster/authorized_keys",
    "/etc/ddp-cluster/known_hosts",
    "/etc/ddp-cluster/ssh_config",
)
# Slurm's settings in the container (slurm role) and its daemons there: one that stopped, or settings
# changed by hand, take the server through the stages again.
SLURM_FILES = ("/etc/slurm/slurm.conf", "/etc/slurm/gres.conf", "/etc/ddp-cluster/munge.key")
SLURM_DAEMONS = ("munged", "slurmd", "slurmctld")  # slurmctld last: only on a controller
# Slurm's own reason for a node it set down when it stopped answering, and the probe's line for such a node.
NOT_RESPONDING = "Not responding"
DOWN_LINE = "slurmd down in Slurm: not responding"

# What each component's drift means, for the check-mode lines and the reasons a server converges.
MEANING = {
    "container": "node container",
    "sshd": "sshd in the container",
    "mesh": "ssh mesh files in the container",
    "slurm": "Slurm's settings or daemons in the container",
    "files": "node.env or hosts file",
    "firewall": "firewall rules",
    "sysctl": "kernel settings",
    "packages": "Python packages for the Docker tasks",
    "hccn": "NPU device network (hccn_tool)",
}

_FILE_LINE = (
    'if [ -f "$f" ]; then echo "$(sha256sum < "$f" | cut -d" " -f1) $(stat -c %a "$f") $f"; '
    'else echo "absent $f"; fi'
)

# Run inside the node container: $1 the sshd port, then the mesh's files.
_INSIDE = (
    "port=$1; shift; "
    f'echo "{MARK} sshd"; '
    'if ss -Htln "sport = :$port" 2>/dev/null | grep -q .; '
    'then echo listening; else echo "not listening"; fi; '
    # The host keys every other node pins: a container that made new ones (its keys removed, then restarted)
    # must take the mesh through again, or every node's known_hosts refuses it.
    'for k in /etc/ssh/ssh_host_*_key.pub; do [ -f "$k" ] && cut -d\' \' -f1,2 "$k"; done; '
    f'echo "{MARK} mesh"; '
    f'for f in "$@"; do {_FILE_LINE}; done; '
    f'echo "{MARK} slurm"; '
    f"for f in {' '.join(SLURM_FILES)}; do {_FILE_LINE}; done; "
    # slurmctld only where slurm.conf makes this node a controller (as ddp-slurm-start decides)
    "ctl=''; grep -q \"^SlurmctldHost=$(hostname)\\(([^)]*)\\)\\?[[:space:]]*$\" "
    "/etc/slurm/slurm.conf 2>/dev/null && ctl=slurmctld; "
    f"for d in {' '.join(SLURM_DAEMONS[:-1])} $ctl; do "
    'if pgrep -x "$d" >/dev/null 2>&1; then echo "$d running"; else echo "$d not running"; fi; done; '
    # A node Slurm set down as not responding (a cut longer than SlurmdTimeout) stays down once the link is
    # back: slurmctld does not ping a down node, and asks it to register only every 20th ping. Its slurmd
    # runs, so nothing above differs: this line does, and site.yml's Slurm stage resumes it. Any other state,
    # or no answer from slurmctld (bounded: 5 s), prints nothing, so a busy or idle node reads the same.
    "if pgrep -x slurmd >/dev/null 2>&1; then "
    'seen=$(timeout 5 sinfo -h -N -n "$(hostname)" -o "%t %E" 2>/dev/null | head -n 1); '
    f'case "$seen" in "down"*" {NOT_RESPONDING}"*) echo "{DOWN_LINE}" ;; esac; fi'
)


def script(spec: Mapping[str, Any]) -> str:
    """The probe of one server, as a POSIX sh script. SPEC: ``container`` (the node container's name),
    ``port`` (its sshd port), ``etc_dir`` (the node's settings directory on the host), ``cluster`` (its name),
    ``host`` (bool: the server gets cluster_host's firewall, kernel and package steps), ``npu_tool`` and
    ``npu_devices`` (hccn_tool's path and the planned devices; none off npu)."""
    q = shlex.quote
    container = str(spec["container"])
    etc_dir = str(spec["etc_dir"]).rstrip("/")
    lines = [
        f"mark() {{ printf '\\n{MARK} %s\\n' \"$1\"; }}",
        f"c={q(container)}",
        "mark container",
        "if command -v docker >/dev/null 2>&1; then",
        "  info=$(docker container inspect --format "
        + q('{{index .Config.Labels "ddp-cluster.spec"}} {{.Image}} {{.State.Running}}')
        + ' "$c" 2>/dev/null) || info=absent',
        "else info='no docker'; fi",
        'echo "$info"',
        'case "$info" in',
        "  *' true')",
        '    docker exec "$c" /bin/sh -c '
        + q(_INSIDE)
        + " sh "
        + " ".join([q(str(spec["port"]))] + [q(path) for path in MESH_FILES])
        + " 2>/dev/null || { mark sshd; echo 'exec failed'; mark mesh; echo 'exec failed';"
        " mark slurm; echo 'exec failed'; } ;;",
        "  *) mark sshd; echo 'not running'; mark mesh; echo 'not running';"
        " mark slurm; echo 'not running' ;;",
        "esac",
        "mark files",
        f"for f in {q(etc_dir + '/node.env')} {q(etc_dir + '/hosts')}; do {_FILE_LINE}; done",
    ]
    if spec.get("host"):
        tag = "ddp-cluster " + str(spec["cluster"])
        lines += [
            "mark firewall",
            "if command -v ufw >/dev/null 2>&1; then",
            # The status line, then this cluster's rules (their comment names the cluster).
            f"  ufw status 2>&1 | awk -v tag={q(tag)} 'NR == 1 || index($0, tag)'",
            "fi",
            "if command -v firewall-cmd >/dev/null 2>&1 && firewall-cmd --state >/dev/null 2>&1; then",
            "  firewall-cmd --list-rich-rules 2>&1",
            "fi",
            "mark sysctl",
            "cat /etc/sysctl.d/*ddp-cluster* 2>/dev/null",
            "sysctl -n net.core.somaxconn net.ipv4.tcp_max_syn_backlog net.ipv4.ip_local_reserved_ports 2>&1",
            "mark packages",
            "if python3 -c 'import docker, requests' >/dev/null 2>&1; then echo present;",
            "else echo missing; fi",
        ]
    devices = [int(device) for device in spec.get("npu_devices") or []]
    if devices:
        lines += [
            "mark hccn",
            f"tool={q(str(spec.get('npu_tool') or 'hccn_tool'))}",
            f"for d in {' '.join(str(device) for device in devices)}; do",
            "  for query in -ip -netdetect -gateway; do",
            '    echo "$d $query: $("$tool" -i "$d" $query -g 2>&1)"',
            "  done",
            "done",
        ]
    lines += [f"mark {END}", "exit 0"]
    return "\n".join(lines) + "\n"


def sections(output: str) -> dict[str, list[str]]:
    """The script's output by component: its lines, blank lines dropped. The ``end`` section is present only
    when the script ran to its end."""
    found: dict[str, list[str]] = {}
    current = None
    for line in output.splitlines():
        if line.startswith(MARK + " "):
            current = line[len(MARK) + 1 :].strip()
            found[current] = []
        elif current is not None and line.strip():
            found[current].append(line.rstrip())
    return found


def complete(output: str) -> bool:
    """Whether the script ran to its end (a cut connection leaves a partial output, which is no state)."""
    return END in sections(output)


def digests(output: str) -> dict[str, str]:
    """Each component's sha256 (of its lines, in order), the end mark left out."""
    return {
        name: hashlib.sha256("\n".join(lines).encode()).hexdigest()
        for name, lines in sections(output).items()
        if name != END
    }


def describe(output: str) -> dict[str, str]:
    """A short word a person reads on some components (check mode's lines): the container's state, sshd's."""
    found = sections(output)
    words = {}
    container = found.get("container") or ["absent"]
    state = container[0].split()[-1] if container[0] not in ("absent", "no docker") else container[0]
    words["container"] = {"true": "running", "false": "not running"}.get(state, state)
    words["sshd"] = (found.get("sshd") or ["?"])[0]
    absent = [line.split()[-1] for line in found.get("mesh") or [] if line.startswith("absent ")]
    if absent:
        words["mesh"] = "missing " + ", ".join(absent)
    slurm = found.get("slurm") or []
    stopped = [line.split()[0] for line in slurm if line.endswith(" not running") and " " in line]
    missing = [line.split()[-1] for line in slurm if line.startswith("absent ")]
    down = ["down in Slurm (not responding)"] if DOWN_LINE in slurm else []
    if missing or stopped or down:
        said = ["missing " + ", ".join(missing)] if missing else []
        words["slurm"] = "; ".join(said + [f"{d} not running" for d in stopped] + down)
    return words
