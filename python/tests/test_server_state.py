"""The probe's script (ddp_cluster.server.state): what it asks, how its output reads, with fake tools."""

from __future__ import annotations

import ast
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from ddp_cluster.server import state

SPEC = {"container": "node0", "port": 12345, "etc_dir": "/var/lib/ddp-cluster/node0/etc", "cluster": "sim"}


def test_the_module_parses_as_python_3_8() -> None:
    source = Path(state.__file__).read_text()
    ast.parse(source, feature_version=(3, 8))  # it ships alone to servers with an older Python


def fake_tools(tmp_path: Path, tools: dict[str, str]) -> dict[str, str]:
    """A PATH holding shell scripts named TOOLS (name: body), before the system's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in tools.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def run(spec: dict[str, object], env: dict[str, str]) -> str:
    done = subprocess.run(
        ["/bin/sh", "-s"], input=state.script(spec), capture_output=True, text=True, env=env, check=True
    )
    return done.stdout


# docker: `container inspect` prints the label, image and running flag; `exec` runs the inner script with a
# stand-in for ss that lists the port when SSHD is set.
DOCKER = """
case "$1" in
  container) [ -n "$ABSENT" ] && exit 1; echo "spec-label sha256:img ${RUNNING:-true}" ;;
  exec) shift 2; exec "$@" ;;
esac
"""


def test_a_running_node_reads_every_component_and_the_same_state_gives_the_same_digests(
    tmp_path: Path,
) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "node.env").write_text("export A=1\n")
    env = fake_tools(tmp_path, {"docker": DOCKER, "ss": 'echo "LISTEN 0 128 0.0.0.0:12345"'})
    spec = {**SPEC, "etc_dir": str(etc)}
    out = run(spec, env)
    assert state.complete(out)
    digests = state.digests(out)
    assert sorted(digests) == ["container", "files", "mesh", "slurm", "sshd"]
    assert state.describe(out)["container"] == "running"
    assert state.describe(out)["sshd"] == "listening"
    assert state.digests(run(spec, env)) == digests
    (etc / "node.env").write_text("export A=2\n")
    changed = state.digests(run(spec, env))
    assert [name for name in digests if digests[name] != changed[name]] == ["files"]


def test_a_stopped_or_missing_container_and_a_missing_docker_are_states(tmp_path: Path) -> None:
    stopped = run(SPEC, {**fake_tools(tmp_path, {"docker": DOCKER}), "RUNNING": "false"})
    assert state.describe(stopped) == {"container": "not running", "sshd": "not running"}
    absent = run(SPEC, {**fake_tools(tmp_path, {"docker": DOCKER}), "ABSENT": "1"})
    assert state.describe(absent)["container"] == "absent"
    assert state.digests(absent)["container"] != state.digests(stopped)["container"]
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("sh", "sha256sum", "cut", "stat", "cat"):
        (bare / tool).symlink_to(shutil.which(tool) or tool)
    no_docker = run(SPEC, {"PATH": str(bare)})
    assert state.complete(no_docker)
    assert state.describe(no_docker)["container"] == "no docker"


def test_mesh_files_missing_in_the_container_are_named(tmp_path: Path) -> None:
    env = fake_tools(tmp_path, {"docker": DOCKER, "ss": "true"})
    out = run(SPEC, env)
    assert state.describe(out)["sshd"] == "not listening"
    assert state.describe(out)["mesh"].startswith("missing /root/.ssh/id_ddp_cluster")


def test_host_components_read_only_this_clusters_firewall_rules(tmp_path: Path) -> None:
    ufw = """echo "Status: active"; echo "10.0.0.0/24 ALLOW ddp-cluster sim"; echo "22 ALLOW # $RULE" """
    env = fake_tools(tmp_path, {"docker": DOCKER, "ufw": ufw, "sysctl": "echo 4096", "python3": "exit 0"})
    spec = {**SPEC, "host": True}
    out = run(spec, {**env, "RULE": "other"})
    assert {"firewall", "sysctl", "packages"} <= set(state.digests(out))
    assert state.sections(out)["firewall"] == ["Status: active", "10.0.0.0/24 ALLOW ddp-cluster sim"]
    # Another tool's rule does not count; a rule of this cluster does.
    assert state.digests(run(spec, {**env, "RULE": "something else"})) == state.digests(out)
    assert (
        state.digests(run(spec, {**env, "RULE": "ddp-cluster sim controller"}))["firewall"]
        != (state.digests(out)["firewall"])
    )
    assert state.sections(out)["packages"] == ["present"]


def test_npu_devices_are_read_with_hccn_tool(tmp_path: Path) -> None:
    tool = tmp_path / "hccn_tool"
    tool.write_text('#!/bin/sh\necho "ipaddr:10.0.0.$2 query $3 $4"\n')
    tool.chmod(0o755)
    env = fake_tools(tmp_path, {"docker": DOCKER})
    out = run({**SPEC, "npu_tool": str(tool), "npu_devices": [0, 1]}, env)
    lines = state.sections(out)["hccn"]
    assert lines[0] == "0 -ip: ipaddr:10.0.0.0 query -ip -g"
    assert len(lines) == 6


@pytest.mark.parametrize("cut", ["", "::ddp-state:: container\nx\n"])
def test_an_output_cut_short_is_not_complete(cut: str) -> None:
    assert not state.complete(cut)


def test_values_are_quoted_for_the_shell() -> None:
    text = state.script({**SPEC, "container": "a; rm -rf /", "etc_dir": "/x y/$(id)"})
    assert "c='a; rm -rf /'" in text
    assert "'/x y/$(id)/node.env'" in text


def test_new_sshd_host_keys_in_the_container_are_drift(tmp_path: Path) -> None:
    # A container that made new host keys (its keys removed, then restarted) is refused by every node's
    # known_hosts: the probe must see it although the container's spec, image and state are the same.
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "ssh_host_ed25519_key.pub").write_text("ssh-ed25519 AAAAold root@node0\n")
    # exec runs the inner script with /etc/ssh/ read from KEYS.
    docker = DOCKER.replace(
        'exec "$@"', 's=$(printf %s "$3" | sed "s#/etc/ssh/#$KEYS#g"); shift 3; exec sh -c "$s" "$@"'
    )
    env = {
        **fake_tools(tmp_path, {"docker": docker, "ss": 'echo "LISTEN 0 128 0.0.0.0:12345"'}),
        "KEYS": f"{keys}/",
    }
    before = state.digests(run(SPEC, env))
    assert state.digests(run(SPEC, env)) == before
    (keys / "ssh_host_ed25519_key.pub").write_text("ssh-ed25519 AAAAnew root@node0\n")
    after = state.digests(run(SPEC, env))
    assert [name for name in before if before[name] != after[name]] == ["sshd"]


def test_a_node_slurm_holds_down_as_not_responding_is_drift_and_other_states_are_not(tmp_path: Path) -> None:
    # slurmctld neither pings a node it set down nor asks it to register but every 20th ping: once the link
    # is back only this line differs, and it takes the node through site.yml's Slurm stage again.
    sinfo = 'echo "$SEEN"'
    env = fake_tools(tmp_path, {"docker": DOCKER, "ss": "true", "pgrep": "exit 0", "sinfo": sinfo})
    outputs = {
        seen: run(SPEC, {**env, "SEEN": seen})
        for seen in (
            "idle none",
            "alloc none",
            "down* Not responding",
            "down Not responding",
            "down* maintenance by ops",
            "drain* Not responding",
            "",
        )
    }
    digest = {seen: state.digests(out)["slurm"] for seen, out in outputs.items()}
    assert digest["idle none"] == digest["alloc none"] == digest[""] == digest["down* maintenance by ops"]
    assert digest["drain* Not responding"] == digest["idle none"]  # a drain is an operator's: not ours to end
    assert digest["down* Not responding"] == digest["down Not responding"] != digest["idle none"]
    assert state.describe(outputs["down* Not responding"])["slurm"].endswith(
        "; down in Slurm (not responding)"
    )
    assert "down in Slurm" not in state.describe(outputs["alloc none"])["slurm"]
    # sinfo that hangs (slurmctld cut off) is bounded and reads as no answer
    hung = fake_tools(tmp_path, {"docker": DOCKER, "ss": "true", "pgrep": "exit 0", "sinfo": "sleep 30"})
    assert state.digests(run(SPEC, hung))["slurm"] == digest["idle none"]


def test_slurmctld_is_read_only_where_slurm_conf_makes_the_node_a_controller(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    docker = DOCKER.replace(
        'exec "$@"',
        's=$(printf %s "$3" | sed "s#/etc/slurm/slurm.conf#$CONF#g"); shift 3; exec sh -c "$s" "$@"',
    )
    tools = {"docker": docker, "ss": "true", "hostname": "echo node0", "pgrep": "exit 1"}
    env = {**fake_tools(tmp_path, tools), "CONF": str(conf)}
    conf.write_text("SlurmctldHost=node1\nSlurmctldHost=node2\n")
    assert not [line for line in state.sections(run(SPEC, env))["slurm"] if line.startswith("slurmctld")]
    conf.write_text("SlurmctldHost=node0(10.0.0.1)\n")
    assert "slurmctld not running" in state.sections(run(SPEC, env))["slurm"]
    assert "slurmctld not running" in state.describe(run(SPEC, env))["slurm"]
