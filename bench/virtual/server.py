"""What a virtual server answers: the responder behind the ``ddp_virtual`` connection and ``bin/ssh``.

A virtual server is a JSON file, ``$DDP_VIRTUAL_DIR/<host>/state.json``, shaped like the sim's servers (cpu,
host network, ufw active, Python with requests, a Docker engine that has the base and node images: the bench
measures the controller, so the image is "present" and never built or pulled). Changing modules update the
file (ufw rules, the node container's specification, its settings file, the mesh files, plain files), so a
bring-up followed by a warm run behaves as on a real server: the first reports changed, the second not.

``answer(host, module, args)`` gives one module's result; ``shell(host, command)`` a command's (rc, stdout,
stderr), ``ssh`` what bin/ssh was asked. A module or command this file does not know raises ``Unknown``:
the bench must not silently skip work a real server would do.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# The sim's base image (ddp-cluster/base:bookworm) as its probe (roles/training_image/tasks/base.yml)
# described it: the wheelhouse key the controller derives from it is the one a sim run used.
BASE_PROBE = (HERE / "base-probe.txt").read_text(encoding="utf-8")
BASE_ID = "sha256:6221c83045caa8424d204836f4bf003bd1a1633ca3dc6cfe2a7c8deab2fa1c32"
DOCKER_VERSION = "27.5.1 amd64"
# The virtual servers' addresses: 10.64.0.0/16, server i at 10.64.0.0 + i + 1 (hosts.py); the controller's.
NETWORK = ipaddress.ip_network("10.64.0.0/16")
CONTROLLER = "10.64.255.254"
# Set to 1: the servers keep each file's text beside its digest (the seed's template bring-up).
CONTENT_ENV = "DDP_VIRTUAL_CONTENT"


class Unknown(Exception):
    """A module or command the virtual server cannot answer."""


def root() -> Path:
    folder = os.environ.get("DDP_VIRTUAL_DIR")
    if not folder:
        raise Unknown("DDP_VIRTUAL_DIR is not set: the virtual servers keep their state there")
    return Path(folder)


def address_of(index: int) -> str:
    return str(NETWORK.network_address + index + 1)


def host_of(address: str) -> str:
    """The virtual server's name for an address (hosts.py names server i vs<i>), or the name itself."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    return f"vs{int(ip) - int(NETWORK.network_address) - 1}"


def index_of(host: str) -> int:
    return int(host[2:]) if re.fullmatch(r"vs[0-9]+", host) else 0


def load(host: str, folder: Path | None = None) -> dict[str, Any]:
    path = (folder or root()) / host / "state.json"
    try:
        state: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        state = {}
    state.setdefault("ufw", [])
    state.setdefault("files", {})  # path -> {"sha256", "mode", "content"?} (server and node container alike)
    state.setdefault("container", None)
    state.setdefault("generation", 0)  # host keys change when the container is made again
    state.setdefault("slurm", [])  # the Slurm daemons running in the node container
    return state


def save(host: str, state: dict[str, Any], folder: Path | None = None) -> None:
    path = (folder or root()) / host / "state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(state, sort_keys=True), encoding="utf-8")
    temporary.replace(path)


def log(host: str, kind: str, what: str) -> None:
    """One line per ssh command a real controller would start for HOST (module run, put, fetch, probe)."""
    path = root() / host / "log.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, (json.dumps({"kind": kind, "what": what}) + "\n").encode())
    finally:
        os.close(descriptor)


def sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def host_key(host: str, generation: int) -> str:
    """A stable ed25519-shaped public key per host and container generation."""
    blob = (
        b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20"
        + hashlib.sha256(f"{host}/{generation}".encode()).digest()
    )
    return "ssh-ed25519 " + base64.b64encode(blob).decode()


def command_result(stdout: str = "", rc: int = 0, stderr: str = "") -> dict[str, Any]:
    return {
        "changed": True,
        "rc": rc,
        "stdout": stdout.rstrip("\n"),
        "stderr": stderr,
        "stdout_lines": stdout.rstrip("\n").splitlines(),
        "stderr_lines": stderr.splitlines(),
        **({"failed": True, "msg": "non-zero return code"} if rc else {}),
    }


# --- commands ---------------------------------------------------------------------------------------------


def run_argv(host: str, argv: list[str], state: dict[str, Any]) -> tuple[int, str, str]:
    """A command module's argv (or a shell line split), answered from the state."""
    text = " ".join(argv)
    address = address_of(index_of(host))
    running = bool(state["container"] and state["container"].get("running"))
    argv = [word for word in argv if not re.match(r"^[0-9]?>", word)]  # a shell line's redirections
    if argv[:3] == ["docker", "image", "inspect"]:  # every image is present (module docstring)
        return 0, image_id(argv[-1]) + "\n", ""
    if argv[:2] == ["docker", "version"]:
        return 0, DOCKER_VERSION + "\n", ""
    if argv[:2] == ["docker", "run"] and "DDP_REPORT=1" in text:
        return 0, BASE_PROBE, ""
    if "for manager in apt-get dnf yum" in text:  # cluster_host's probe
        return (
            0,
            "manager: apt-get\npython: requests\npyversion: 3.11\n"
            f"ssh: {CONTROLLER} 50000 {address} 22\nufw: active\nephemeral: 32768\t60999\n"
            "registry: present\n",
            "",
        )
    if (
        "ip -o -4 addr show dev" in text and "resolved:" in text
    ):  # cluster_preflight's network and ports probe
        lines = [f"container: {'true' if running else ''}", f"address: {address}/16", f"resolved: {address}"]
        if running:
            port = state["container"].get("ssh_port", "12345")
            lines.append(f"listening: LISTEN 0 128 {address}:{port} 0.0.0.0:*")
        return 0, "\n".join(lines) + "\n", ""
    if argv[:1] in (["hostname"], ["true"]) or text.startswith("command -v"):
        return 0, host + "\n", ""
    raise Unknown(f"{host}: the virtual server does not know the command {text[:300]!r}")


def shell(host: str, command: str) -> tuple[int, str, str]:
    """A command Ansible runs by itself (tmp dirs, chmod, cleanup) or a raw task's script."""
    state = load(host)
    # Ansible wraps its commands: /bin/sh -c '<command> && sleep 0'.
    if command.startswith("/bin/sh -c "):
        parts = shlex.split(command)
        command = parts[2] if len(parts) > 2 else ""
    command = re.sub(r"\s*&& sleep 0$", "", command.strip())
    if command.startswith("echo ~"):
        return 0, "/root\n", ""
    made = re.search(r"echo (ansible-tmp-[^=]+)=\"?`?\s*echo ([^ `\"]+)", command)
    if "mkdir" in command and made:
        folder = made.group(2)
        (root() / host / "fs" / folder.lstrip("/")).mkdir(parents=True, exist_ok=True)
        return 0, f"{made.group(1)}={folder}\n", ""
    if re.match(r"^(rm -f -r|chmod|rm -rf)", command):
        return 0, "", ""
    if "ssh -o BatchMode=yes" in command and "hostname" in command:  # ssh_mesh's ring login
        return 0, "", ""
    if "/usr/local/sbin/ddp-slurm-start" in command:  # the slurm role's start (docker/slurm-start.sh)
        return slurm_start(host, state, restart=command.rstrip().endswith(" restart"))
    if "sinfo -h -N -n" in command:  # the slurm role's wait: every node answers (their daemons run)
        return 0, "", ""
    if "ddp_cluster.supervisor.drain" in command and "--show" in command:  # no node is drained
        return 0, json.dumps({"drained": {}, "unknown": []}) + "\n", ""
    if "ddp_cluster.supervisor.check" in command:  # the first node checks every node (job/node_check.py)
        return 0, json.dumps({"answers": checked(command)}) + "\n", ""
    if "ddp_cluster.supervisor.jobs" in command:  # a node's jobs (job/node_jobs.py): an idle node
        running = bool(state["container"] and state["container"].get("running"))
        if not running:
            return 0, "down: 1\n", ""
        return 0, json.dumps({"jobs": {}}) + ("\nup\n" if "echo up" in command else "\n"), ""
    try:
        argv = shlex.split(command)
    except ValueError:
        argv = [command]
    return run_argv(host, argv, state)


def slurm_start(host: str, state: dict[str, Any], restart: bool) -> tuple[int, str, str]:
    """munged, slurmd and (on vs0, the default controller) slurmctld, as docker/slurm-start.sh starts them."""
    wanted = ["munged", "slurmd", *(["slurmctld"] if index_of(host) == 0 else [])]
    if not all(path in state["files"] for path in SLURM_FILES):
        return 0, f"no Slurm settings on {host} yet (site.yml writes them)\n", ""
    lines = [("running " if name in state["slurm"] and not restart else "started ") + name for name in wanted]
    if state["slurm"] != wanted or restart:
        state["slurm"] = wanted
        save(host, state)
    return 0, "\n".join(lines) + "\n", ""


def checked(command: str) -> dict[str, str]:
    """The first node's answers for the nodes its check lists: an idle node whose container runs, as
    ``python -m ddp_cluster.supervisor.check`` prints them (the first node asks the others over the mesh)."""
    inner = shlex.split(command)[-1]
    words = shlex.split(inner.split("&&", 1)[1]) if "&&" in inner else []
    nodes = words[words.index("--nodes") + 1].split(",") if "--nodes" in words else []
    answers = {}
    for node in nodes:
        container = load(node).get("container") or {}
        idle = json.dumps({"jobs": {}}) + "\nup\n"
        down = f"down: no answer over the mesh's ssh from {nodes[0]}"
        answers[node] = idle if container.get("running") else down
    return answers


# --- modules ----------------------------------------------------------------------------------------------


def write_file(state: dict[str, Any], path: str, content: str, mode: Any) -> bool:
    mode_int = int(str(mode), 8) if mode not in (None, "") else 0o644
    wanted = {"sha256": sha(content), "mode": mode_int}
    have = state["files"].get(path) or {}
    if {k: v for k, v in have.items() if k != "content"} == wanted:
        return False
    # A seed's template (bench/virtual/seed.py) keeps the text, to write it for other servers and sizes; a
    # server keeps only its digest and mode otherwise, as the probe reads them.
    if os.environ.get(CONTENT_ENV) == "1":
        wanted["content"] = content
    state["files"][path] = wanted
    return True


def ufw(host: str, args: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    if args.get("state") == "disabled":
        raise Unknown(f"{host}: the virtual servers keep ufw on (cluster_host_firewall: open)")
    rule = json.dumps(
        {k: args.get(k) for k in ("rule", "from_ip", "to_port", "proto", "comment")}, sort_keys=True
    )
    if rule in state["ufw"]:
        return {"changed": False, "msg": "Status: active"}
    state["ufw"].append(rule)
    return {"changed": True, "msg": "Rule added"}


def node_container(host: str, args: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    spec = dict(args["container"])
    wanted = json.dumps({**spec, "image_id": image_id(spec["image"])}, sort_keys=True, separators=(",", ":"))
    settings = args["settings"]
    actions = []
    if write_file(state, str(settings["path"]), str(settings["content"]), settings.get("mode")):
        actions.append(f"wrote {settings['path']}")
    before = state["container"]
    if not before or before.get("spec") != wanted:
        state["generation"] += 1
        # A new container has none of the mesh's files: they lived in its own filesystem.
        state["files"] = {
            p: v for p, v in state["files"].items() if not p.startswith(("/root/.ssh/", "/etc/ddp"))
        }
        state["container"] = {"spec": wanted, "running": True, "ssh_port": str(args["sshd"]["port"])}
        state[
            "slurm"
        ] = []  # nor Slurm's settings (/etc/slurm, /etc/ddp-cluster): its daemons start once given
        state["files"] = {p: v for p, v in state["files"].items() if not p.startswith("/etc/slurm/")}
        actions.append(("replaced" if before else "created") + f" container {spec['name']}")
    sshd = args["sshd"]
    port, listen = int(sshd["port"]), str(sshd.get("listen") or "")
    where = f"{listen}:{port}" if listen else ""
    lines = [f"port {port}", *([f"listenaddress {where}"] if where else [])]
    lines += [
        "passwordauthentication no",
        "kbdinteractiveauthentication no",
        "permitrootlogin without-password",
        "authorizedkeysfile /etc/ddp-cluster/authorized_keys",
        "permituserrc no",
    ]
    lines += [
        "ddp-node interface: eth0",
        f"ddp-node address: {address_of(index_of(host))}/16",
        "ddp-node cpu-binding: ",
    ]
    for path in sshd.get("files") or []:
        have = state["files"].get(str(path))
        if have:
            lines.append(f"ddp-node file: {have['sha256']} {have['mode']:o} {path}")
    lines.append(f"ddp-node host-key-ed25519: {host_key(host, state['generation'])}")
    return {
        "changed": bool(actions),
        "actions": actions,
        "container_changed": any("container" in action for action in actions),
        "sshd": lines,
        "sshd_error": "",
    }


def image_id(name: str) -> str:
    return BASE_ID if name.startswith("ddp-cluster/base:") else "sha256:" + sha(name.split(":")[0])


def image_info(name: str) -> dict[str, Any]:
    return {"Id": image_id(name), "RepoTags": [name], "Architecture": "amd64", "Os": "linux"}


def mesh_files(args: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    changed = [
        str(item["path"])
        for item in list(args.get("secret_files") or []) + list(args.get("files") or [])
        if write_file(state, str(item["path"]), str(item["content"]), item.get("mode"))
    ]
    return {"changed": bool(changed), "changed_paths": changed}


def answer(host: str, module: str, args: dict[str, Any]) -> dict[str, Any]:
    """The result of MODULE run with ARGS on HOST (the state updated as the real module would change it)."""
    name = module.rsplit(".", 1)[-1]
    check = bool(args.get("_ansible_check_mode"))
    # Ansible's own arguments (_ansible_check_mode, ...) are not the module's.
    args = {k: v for k, v in args.items() if not k.startswith("_ansible_")}
    state = load(host)
    before = json.dumps(state, sort_keys=True)
    result: dict[str, Any]
    if name == "ping":
        result = {"ping": "pong", "changed": False}
    elif name in ("command", "shell"):
        raw = args.get("_raw_params") or args.get("cmd")
        argv = [str(a) for a in args["argv"]] if args.get("argv") else shlex.split(str(raw))
        rc, out, err = run_argv(host, argv, state)
        result = command_result(out, rc, err)
    elif name == "docker_image_info":
        names = args.get("name") or []
        names = [names] if isinstance(names, str) else names
        result = {"changed": False, "images": [image_info(n) for n in names]}
    elif name == "docker_image":
        result = {"changed": False, "actions": [], "image": image_info(str(args["name"]))}
        result["image"]["RepoTags"].append(str(args["name"]).split(":")[0] + ":latest")
    elif name == "docker_host_info":
        result = {"changed": False, "host_info": {"Runtimes": {"runc": {}}, "Architecture": "x86_64"}}
    elif name == "ufw":
        result = ufw(host, args, state)
    elif name == "ddp_node_container":
        result = node_container(host, args, state)
    elif name == "ddp_mesh_files":
        result = mesh_files(args, state)
    elif name == "slurp":
        source = str(args.get("src") or args.get("path"))
        if not source.startswith("/etc/ssh/ssh_host_"):
            raise Unknown(f"{host}: the virtual server has no file {source} to slurp")
        content = host_key(host, state["generation"]) + f" root@{host}\n"
        result = {
            "changed": False,
            "content": base64.b64encode(content.encode()).decode(),
            "encoding": "base64",
        }
    elif name == "stat":
        have = state["files"].get(str(args["path"]))
        result = {
            "changed": False,
            "stat": {"exists": bool(have), **({"mode": f"{have['mode']:04o}"} if have else {})},
        }
    elif name == "file":
        result = {"changed": False, "path": args.get("path"), "state": args.get("state", "file")}
        if args.get("state") == "directory" and str(args["path"]) not in state["files"]:
            state["files"][str(args["path"])] = {"sha256": "directory", "mode": 0o755}
            result["changed"] = True
    elif name == "copy":
        content = args.get("content")
        if content is None:  # the copy action put the file on the server first (its fs/, the connection's)
            given = str(args.get("src"))
            source = root() / host / "fs" / given.lstrip("/")
            if not source.is_file():
                raise Unknown(f"{host}: copy's source {given} was not put on the virtual server")
            content = source.read_text(encoding="utf-8", errors="replace")
        result = {"changed": write_file(state, str(args["dest"]), str(content), args.get("mode"))}
    elif name == "sysctl":
        key = f"sysctl:{args['name']}"
        result = {"changed": write_file(state, key, str(args.get("value")), "0644")}
    else:
        raise Unknown(
            f"{host}: the virtual server does not know the module {module} (args {sorted(args)}): teach "
            "bench/virtual/server.py how a server answers it"
        )
    if json.dumps(state, sort_keys=True) != before and not check:
        save(host, state)
    return result


# --- the payload --------------------------------------------------------------------------------------------

_CALL = "_ansiballz_main("


def parse_payload(data: bytes) -> tuple[str, dict[str, Any]]:
    """The module name and its arguments from an AnsiballZ wrapper as pipelining sends it (ansible-core 2.19:
    the wrapper ends with ``_ansiballz_main(`` and one ``key=repr(value),`` line per argument, among them
    ``ansible_module`` and ``params``, the JSON of ``{"ANSIBLE_MODULE_ARGS": ...}``)."""
    import ast

    text = data.decode("utf-8", errors="replace")
    start = text.rfind(_CALL)
    if start < 0:
        raise Unknown(
            "not an AnsiballZ payload (no _ansiballz_main call): this ansible-core is not 2.19's shape"
        )
    found: dict[str, Any] = {}
    for line in text[start + len(_CALL) :].splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key in ("ansible_module", "params"):
            found[key] = ast.literal_eval(value.rstrip(","))
    if set(found) != {"ansible_module", "params"}:
        raise Unknown(f"the AnsiballZ payload lacks {sorted({'ansible_module', 'params'} - set(found))}")
    args = json.loads(found["params"])["ANSIBLE_MODULE_ARGS"]
    return str(found["ansible_module"]), dict(args)


def ssh(host: str, command: str, script: str = "") -> tuple[int, str, str]:
    """A command the controller runs over ssh itself (bin/ssh): a script on stdin, or the command line."""
    if STATE_MARK in script:
        return 0, probe(host, script), ""
    return shell(host, script or command)


# The warm path's probe (python/src/ddp_cluster/server/state.py): sections ``::ddp-state:: NAME`` in the
# order the script marks them, each answered from the state as the script would read the server.
STATE_MARK = "::ddp-state::"
MESH_FILES = (
    "/root/.ssh/id_ddp_cluster",
    "/etc/ddp-cluster/authorized_keys",
    "/etc/ddp-cluster/known_hosts",
    "/etc/ddp-cluster/ssh_config",
)
SLURM_FILES = ("/etc/slurm/slurm.conf", "/etc/slurm/gres.conf", "/etc/ddp-cluster/munge.key")
SLURM_DAEMONS = ("munged", "slurmd", "slurmctld")


def file_line(state: dict[str, Any], path: str) -> str:
    have = state["files"].get(path)
    return f"{have['sha256']} {have['mode']:o} {path}" if have else f"absent {path}"


def probe(host: str, script: str) -> str:
    state = load(host)
    container = state["container"]
    running = bool(container and container.get("running"))
    out: list[str] = []
    for name in re.findall(r"^\s*mark ([a-z_]+)", script, re.M):
        if name in ("sshd", "mesh", "slurm") and out and any(line.endswith(f" {name}") for line in out):
            continue  # the script marks them inside the container or in its fallback: once
        out.append(f"{STATE_MARK} {name}")
        if name == "container":
            if container:
                spec = json.loads(container["spec"])
                label = hashlib.sha256(container["spec"].encode()).hexdigest()
                out.append(f"{label} {spec.get('image_id', '')} {'true' if running else 'false'}")
            else:
                out.append("absent")
            out.append(f"{STATE_MARK} sshd")
            out.append("listening" if running else "not running")
            out.append(f"{STATE_MARK} mesh")
            out += [file_line(state, path) if running else "not running" for path in MESH_FILES]
            out.append(f"{STATE_MARK} slurm")
            if running:
                out += [file_line(state, path) for path in SLURM_FILES]
                out += [f"{d} {'running' if d in state['slurm'] else 'not running'}" for d in SLURM_DAEMONS]
            else:
                out.append("not running")
        elif name == "files":
            listed = re.search(r"^\s*mark files\n(?:.*\n)*?for f in (.*?); do", script, re.M)
            for path in shlex.split(listed.group(1)) if listed else []:
                out.append(file_line(state, path))
        elif name == "firewall":
            out.append("Status: active")
            out += sorted(state["ufw"])
        elif name == "sysctl":
            settings = sorted(item for item in state["files"].items() if item[0].startswith("sysctl:"))
            out += [f"{key}={value['sha256']}" for key, value in settings]
        elif name == "packages":
            out.append("present")
        elif name == "end":
            pass
        else:
            raise Unknown(f"{host}: the virtual server cannot answer the probe's section {name!r}")
    return "\n".join(out) + "\n"
