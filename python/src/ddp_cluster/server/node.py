"""Bring one node up on its server in one pass: its directories, its settings file, its container and sshd's
check; and read what the check printed.

One module for the ``node_container`` role's Ansible module ``ddp_node_container`` (which ships this file to
the servers as module_utils, so it uses the standard library only and runs on Python 3.8) and for the role's
action on the controller, which reads the probe's lines with the same code that knows their format:

- :func:`bring_up`: on the server, the whole stage for one node (each step only when something differs);
- :func:`jobs_in`, :func:`guard_jobs`: the jobs that run in a container that would be recreated, asked of the
  node itself, and what that means: refused (before anything changes on the node), waited for, or forced;
- :func:`run_argv`, :func:`gpus_option`: the ``docker create`` arguments of a container specification;
- :func:`sshd_failure`, :func:`probe_lines`, :func:`host_keys`, :func:`files_of`, :func:`record_of`: on the
  controller, sshd's effective configuration checked and the probe's ``ddp-node KEY: VALUE`` lines read.

The container's specification (its image's id included) is kept in its label ``ddp-cluster.spec``: a container
whose label differs from the one asked for is removed and created again, so a new image, a changed volume or
variable, or a container made by hand under the node's name is replaced, and an unchanged one left running.
Replacing a container stops what runs in it: when a job runs there (the node's own answer, the command that
``ddp_cluster.job.node_jobs.command`` builds on the controller), the node is refused by name before anything
changes on it, unless the run waits for the job to end (``wait``, within ``wait_timeout``) or forces it
(``force``, said in a warning).
"""

from __future__ import annotations

import csv
import io
import ipaddress
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from typing import Any

SPEC_LABEL = "ddp-cluster.spec"
DOCKER_TIMEOUT = 120
NO_DOCKER_CLI = (
    "the docker CLI is not on this server's PATH: install it with the engine (docker-ce-cli, or Debian's "
    "docker.io)"
)
SSHD_KEYS = re.compile(
    r"^(port|listenaddress|passwordauthentication|kbdinteractiveauthentication|permitrootlogin"
    r"|authorizedkeysfile|permituserrc) "
)
PROBE = re.compile(r"^ddp-node ([a-z0-9-]+): ?(.*)$")


# Travels alone to the servers, so it cannot derive from ddp_cluster.errors.DdpClusterError.
class NodeError(Exception):
    """The node cannot be brought up; the message says why and what to do."""


def docker(
    *args: str, check: bool = True, timeout: float = DOCKER_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False, timeout=timeout)
    except FileNotFoundError as error:
        raise NodeError(NO_DOCKER_CLI) from error
    except subprocess.TimeoutExpired as error:
        raise NodeError(f"`docker {' '.join(args[:2])}` did not answer within {timeout:.0f} s") from error
    if check and done.returncode != 0:
        raise NodeError(f"`docker {' '.join(args)}` failed: {(done.stderr or done.stdout).strip()}")
    return done


def directories(entries: list[dict[str, Any]], check: bool) -> list[str]:
    """Each entry's directory made, or its mode and owner (root) set, where they differ: what was done."""
    actions = []
    for entry in entries:
        path, mode = entry["path"], int(str(entry["mode"]), 8)
        try:
            info = os.stat(path)
        except FileNotFoundError:
            actions.append(f"created directory {path}")
            if not check:
                os.makedirs(path, mode=mode, exist_ok=True)
                os.chmod(path, mode)
                os.chown(path, 0, 0)
            continue
        if not stat.S_ISDIR(info.st_mode):
            raise NodeError(f"{path} exists and is not a directory: move it away")
        if stat.S_IMODE(info.st_mode) != mode or (info.st_uid, info.st_gid) != (0, 0):
            actions.append(f"set {path} to {entry['mode']} root:root")
            if not check:
                os.chmod(path, mode)
                os.chown(path, 0, 0)
    return actions


def settings_file(spec: dict[str, Any], check: bool, diff: dict[str, Any]) -> list[str]:
    """The settings file written (to a temporary file renamed over it) when its content or mode differs."""
    path, content, mode = spec["path"], spec["content"], int(str(spec["mode"]), 8)
    try:
        with open(path, encoding="utf-8") as handle:
            before: str | None = handle.read()
        before_mode: int | None = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        before, before_mode = None, None
    if before == content and before_mode == mode:
        return []
    diff["before"]["settings"], diff["after"]["settings"] = before or "", content
    if not check:
        descriptor, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".ddp-node-")
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(content)
            os.chmod(temporary, mode)
            os.chown(temporary, 0, 0)
            os.replace(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise
    return [f"wrote {path}" if before is not None else f"created {path}"]


def gpus_option(request: dict[str, Any]) -> str:
    """docker_container's device_requests entry as the CLI's --gpus value (a CSV record)."""
    fields = []
    if request.get("device_ids"):
        fields.append("device=" + ",".join(str(device) for device in request["device_ids"]))
    else:
        count = int(request.get("count", -1))
        fields.append("count=" + ("all" if count < 0 else str(count)))
    if request.get("driver"):
        fields.append(f"driver={request['driver']}")
    capabilities = request.get("capabilities") or []
    if len(capabilities) > 1:
        raise NodeError(
            "node_container_device_requests: an entry lists more than one set of capabilities; give one set, "
            "e.g. capabilities: [[gpu, utility, compute]]"
        )
    if capabilities:
        fields.append("capabilities=" + ",".join(capabilities[0]))
    if request.get("options"):
        raise NodeError("node_container_device_requests: options are not supported; leave them out")
    line = io.StringIO()
    csv.writer(line, lineterminator="").writerow(fields)
    return line.getvalue()


def run_argv(spec: dict[str, Any], label: str) -> list[str]:
    """`docker create` arguments for the container SPEC, its specification LABEL on it."""
    argv = ["create", "--name", spec["name"], "--hostname", spec["hostname"]]
    argv += ["--restart", spec["restart_policy"], "--ipc", spec["ipc_mode"]]
    if spec.get("init"):
        argv.append("--init")
    if spec.get("shm_size"):
        argv += ["--shm-size", str(spec["shm_size"])]
    for ulimit in spec.get("ulimits") or []:
        name, _, limits = str(ulimit).partition(":")
        argv += ["--ulimit", f"{name}={limits}"]
    if spec.get("runtime"):
        argv += ["--runtime", spec["runtime"]]
    for name, value in sorted((spec.get("env") or {}).items()):
        argv += ["--env", f"{name}={value}"]
    argv += ["--network", spec["network"]]
    for alias in spec.get("aliases") or []:
        argv += ["--network-alias", alias]
    for name, address in sorted((spec.get("etc_hosts") or {}).items()):
        argv += ["--add-host", f"{name}:{address}"]
    for volume in spec.get("volumes") or []:
        argv += ["--volume", volume]
    for device in spec.get("devices") or []:
        argv += ["--device", device]
    for request in spec.get("device_requests") or []:
        argv += ["--gpus", gpus_option(request)]
    for name, value in sorted((spec.get("labels") or {}).items()):
        argv += ["--label", f"{name}={value}"]
    argv += ["--label", f"{SPEC_LABEL}={label}", spec["image"]]
    return argv


def plan_container(spec: dict[str, Any], check: bool) -> dict[str, Any]:
    """What the node's container needs, read from the engine and changing nothing: ``do`` is ``none``,
    ``start``, ``create``, ``replace`` (a running or stopped container made from another specification, or
    by hand, or, in check mode, one whose new image is not built yet) or ``no-image`` (check mode before the
    image stage built the first one); ``wanted`` the specification label ('' without the image), ``before``
    the found one, ``running`` whether the found container runs."""
    image = docker("image", "inspect", "--format", "{{.Id}}", spec["image"], check=False)
    if image.returncode != 0 and not check:
        raise NodeError(
            f"image {spec['image']} is not on this server's engine: run the image stage first "
            "(ansible-playbook site.yml --tags image), or set node_container_image to an image it has"
        )
    # Check mode: the image stage, in check mode too, only said it would build it.
    wanted = (
        json.dumps({**spec, "image_id": image.stdout.strip()}, sort_keys=True, separators=(",", ":"))
        if image.returncode == 0
        else ""
    )
    found = docker("container", "inspect", spec["name"], check=False)
    if found.returncode != 0:
        return {"do": "create" if wanted else "no-image", "wanted": wanted, "running": False}
    info = json.loads(found.stdout)[0]
    label = (info["Config"].get("Labels") or {}).get(SPEC_LABEL, "")
    running = bool(info["State"].get("Running"))
    if wanted and label == wanted:
        return {"do": "none" if running else "start", "wanted": wanted, "running": running}
    return {"do": "replace", "wanted": wanted, "before": label, "running": running}


def container(
    spec: dict[str, Any], plan: dict[str, Any], check: bool, diff: dict[str, Any]
) -> tuple[list[str], bool]:
    """Do what :func:`plan_container` found the container needs: (actions, whether it runs or will)."""
    not_built = f"would create container {spec['name']} from {spec['image']} (not on this engine yet)"
    if plan["do"] == "no-image":
        return [not_built], False
    if plan["do"] == "none":
        return [], True
    actions = []
    if plan["do"] == "start":
        actions.append(f"started container {spec['name']}")
        if not check:
            docker("start", spec["name"])
        return actions, not check
    if plan["do"] == "replace":
        label = plan["before"]
        diff["before"]["container"] = json.loads(label) if label.startswith("{") else "(made elsewhere)"
        actions.append(f"removed container {spec['name']} (its specification differs)")
        if not check:
            docker("rm", "--force", spec["name"])
    if not plan["wanted"]:
        return [*actions, not_built], False
    diff["after"]["container"] = json.loads(plan["wanted"])
    actions.append(f"created and started container {spec['name']} from {spec['image']}")
    if not check:
        docker(*run_argv(spec, plan["wanted"]))
        docker("start", spec["name"])
    return actions, not check


# --- the jobs that a replaced container would stop ---------------------------------------------------------

# Seconds between looks while waiting for a node's jobs to end, for one look, and for a job's stop (its
# supervisor's minute to stop every rank, then the node's own sweep).
JOBS_POLL = 5.0
JOBS_TIMEOUT = 60
STOP_TIMEOUT = 150


def busy_jobs(output: str) -> dict[str, list[str]] | None:
    """The jobs whose processes run on the node (job id -> its nodes), from the node's answer: its last JSON
    line, ``busy`` (the job ids) and ``jobs`` (each job's ``nodes``), as ``ddp_cluster.supervisor.jobs``
    prints it (the controller reads the same answer with ``ddp_cluster.job.node_jobs.busy``). None when there
    is no such line."""
    for line in reversed(output.strip().splitlines()):
        if not line.startswith("{"):
            continue
        try:
            report = json.loads(line)
        except ValueError:
            return None
        if not isinstance(report, dict):
            return None
        listed = report.get("jobs")
        jobs = listed if isinstance(listed, dict) else {}
        found: dict[str, list[str]] = {}
        for job in report.get("busy") or []:
            item = jobs.get(job)
            nodes = item.get("nodes") if isinstance(item, dict) else None
            found[str(job)] = [str(node) for node in nodes] if isinstance(nodes, list) else []
        return found
    return None


def jobs_in(name: str, command: str) -> tuple[dict[str, list[str]], str]:
    """(the jobs that run in container ``name``: job id -> its nodes, why the node did not say): ``command``
    asked in the container. A container that does not answer (stopped, or an image without the package) runs
    none that it could report."""
    done = docker("exec", name, "/bin/bash", "-c", command, check=False, timeout=JOBS_TIMEOUT)
    found = busy_jobs(done.stdout) if done.returncode == 0 else None
    if found is None:
        said = (done.stderr.strip() or done.stdout.strip() or f"rc {done.returncode}").splitlines()
        return {}, said[-1][:200]
    return found, ""


def describe_jobs(jobs: dict[str, list[str]]) -> str:
    """'job A (nodes node0, node1)', or 'jobs A (nodes ...), B (nodes ...)'."""
    parts = [f"{job} (nodes {', '.join(nodes)})" if nodes else job for job, nodes in sorted(jobs.items())]
    return ("job " if len(parts) == 1 else "jobs ") + ", ".join(parts)


def refusal(name: str, jobs: dict[str, list[str]], why: str, timeout: float) -> str:
    """Why node ``name``'s container is not recreated while ``jobs`` run in it, and the three ways on."""
    stops = ", then ".join(f"`ansible-playbook jobs.yml -e stop={job}`" for job in sorted(jobs))
    return (
        f"{describe_jobs(jobs)} {'runs' if len(jobs) == 1 else 'run'} on {name}, and its container would be "
        f"recreated ({why}), which stops "
        f"every process in it: {name} was refused, nothing was changed on it. Stop the job first ({stops}), "
        f"or run site.yml again with -e wait=true (it waits for the job to end, at most "
        f"node_container_wait_timeout={timeout:.0f} s), or with -e force=true (recreates the container now "
        "and stops the job)."
    )


def stop_jobs(name: str, found: dict[str, list[str]], stop_command: str) -> tuple[list[str], list[str]]:
    """Each job of ``found`` stopped in the container ``name`` as jobs.yml stops it (``stop_command``, its
    ``{job}`` replaced by the id), before the container goes: its supervisor (when it lives here) stops every
    rank on every node and records why, and the node's claim is released. (stopped, warnings)."""
    stopped, warnings = [], []
    for job in sorted(found):
        command = stop_command.replace("{job}", job)
        done = docker("exec", name, "/bin/bash", "-c", command, check=False, timeout=STOP_TIMEOUT)
        if done.returncode == 0:
            stopped.append(f"stopped job {job} (force=true)")
        else:
            said = (done.stderr.strip() or done.stdout.strip() or f"rc {done.returncode}").splitlines()
            warnings.append(f"{name}: job {job} did not stop cleanly ({said[-1][:200]}): removing it")
    return stopped, warnings


def guard_jobs(
    name: str,
    plan: dict[str, Any],
    jobs: dict[str, Any] | None,
    check: bool,
) -> tuple[list[str], list[str]]:
    """Before anything changes on the node: when its running container would be recreated (``plan``) and
    jobs run in it (asked with ``jobs["command"]``), NodeError naming them and how to go on, unless
    ``jobs["force"]`` (each stopped first with ``jobs["stop_command"]``, ``{job}`` in it replaced by its id,
    and recreated; a warning names them) or ``jobs["wait"]`` (their end waited for, at most
    ``jobs["wait_timeout"]`` s). Check mode only says what it would do. (actions, warnings)."""
    if plan["do"] != "replace" or not plan["running"] or not jobs or not jobs.get("command"):
        return [], []
    found, unanswered = jobs_in(name, str(jobs["command"]))
    if unanswered:
        return [], [f"{name}: could not ask the node which jobs run there ({unanswered}): recreating it"]
    if not found:
        return [], []
    would = "would stop" if check else "stops"
    if jobs.get("force"):
        warnings = [f"force=true: recreating {name} {would} {describe_jobs(found)}"]
        if check or not jobs.get("stop_command"):
            return [], warnings
        stopped, unclean = stop_jobs(name, found, str(jobs["stop_command"]))
        return stopped, warnings + unclean
    made_here = str(plan.get("before", "")).startswith("{")
    why = "its specification changed" if made_here else "it was not made by site.yml"
    timeout = float(jobs.get("wait_timeout") or 0)
    if not jobs.get("wait"):
        raise NodeError(refusal(name, found, why, timeout))
    if check:
        return [f"would wait for {describe_jobs(found)} to end (at most {timeout:.0f} s), then recreate"], []
    started = time.monotonic()
    poll = float(jobs.get("poll") or JOBS_POLL)
    while found:
        if time.monotonic() - started >= timeout:
            raise NodeError(
                f"{describe_jobs(found)} still {'runs' if len(found) == 1 else 'run'} on {name} after "
                f"{timeout:.0f} s of waiting (node_container_wait_timeout): {name} was refused, nothing was "
                "changed on it. Stop the job "
                f"(`ansible-playbook jobs.yml -e stop={sorted(found)[0]}`), wait longer (-e "
                "node_container_wait_timeout=SECONDS), or run site.yml with -e force=true (recreates the "
                "container now and stops the job)."
            )
        time.sleep(poll)
        ended = found
        found, _ = jobs_in(name, str(jobs["command"]))
    return [f"waited {time.monotonic() - started:.0f} s for {describe_jobs(ended)} to end"], []


def wait_for_sshd(name: str, sshd: dict[str, Any]) -> tuple[list[str], str]:
    """The probe's lines once it exits 0 within the timeout; else ([], why)."""
    deadline = time.monotonic() + float(sshd["timeout"])
    files = [str(path) for path in sshd.get("files") or []]
    while True:
        done = docker(
            "exec", name, "/bin/sh", "-c", sshd["probe"], str(sshd["port"]), *files, check=False, timeout=30
        )
        if done.returncode == 0:
            return done.stdout.splitlines(), ""
        why = (done.stderr or done.stdout).strip()
        if time.monotonic() >= deadline:
            return [], why
        time.sleep(0.25)


def bring_up(params: dict[str, Any], check: bool) -> dict[str, Any]:
    """The module's whole run: the jobs a replaced container would stop (``params["jobs"]``, see
    :func:`guard_jobs`), directories, settings file, container, then the probe's lines once sshd answers (none
    in check mode before the container exists). The result: changed, actions, container_changed, sshd,
    sshd_error, diff (before and after of the settings file and the specification) and warnings. NodeError
    when a step cannot be done, or the node is refused for its jobs."""
    if shutil.which("docker") is None:
        raise NodeError(NO_DOCKER_CLI)
    diff: dict[str, Any] = {"before": {}, "after": {}}
    spec = params["container"]
    plan = plan_container(spec, check)
    # The jobs first: a refused node is left exactly as it was (directories and settings file included).
    waited, warnings = guard_jobs(spec["name"], plan, params.get("jobs"), check)
    actions = directories(params["directories"], check)
    actions += settings_file(params["settings"], check, diff)
    done, running = container(spec, plan, check, diff)
    actions += done
    lines, why = wait_for_sshd(spec["name"], params["sshd"]) if running else ([], "")
    return {
        "changed": bool(actions),
        "actions": waited + actions,
        "container_changed": bool(done),
        "sshd": lines,
        "sshd_error": why,
        "diff": diff,
        "warnings": warnings,
    }


# --- the probe's lines, read on the controller -------------------------------------------------------------


def expected_sshd(port: int, listen: str = "") -> list[str]:
    """The lines of `sshd -T` the cluster needs: its port, the address it listens on (when given: the node's
    cluster address on a host network), password and keyboard-interactive login off, root by key only, and
    by the mesh's key alone (one authorized-keys file, not in root's home, where a job could leave a key; no
    ~/.ssh/rc run at a login)."""
    where = f"[{listen}]:{port}" if ":" in listen else f"{listen}:{port}"
    return [
        f"port {port}",
        *([f"listenaddress {where}"] if listen else []),
        "passwordauthentication no",
        "kbdinteractiveauthentication no",
        "permitrootlogin without-password",
        "authorizedkeysfile /etc/ddp-cluster/authorized_keys",
        "permituserrc no",
    ]


def sshd_failure(host: str, container: str, sshd: dict[str, Any], lines: list[str], why: str) -> str:
    """Why the node's sshd is not ready for the cluster, by its probe's LINES (none: it did not answer in
    time, WHY says what it printed) and its `sshd -T` output; empty when it is ready. ``sshd["listen"]``, when
    given, is the one address sshd must listen on."""
    port, listen = int(sshd["port"]), str(sshd.get("listen") or "")
    if not lines:
        return (
            f"{host}: sshd in container {container} did not answer on port {port} within {sshd['timeout']} s "
            f"({why or 'no output'}): read `docker logs {container}` on the server"
        )
    missing = [line for line in expected_sshd(port, listen) if line not in lines]
    if not missing:
        return ""
    return (
        f"{host}: sshd in container {container} is not configured as the cluster needs (port {port}"
        f"{f' on {listen} only' if listen else ''}, password login off, root by the mesh's key only):"
        " it lacks "
        f"{missing}; `sshd -T` says {[line for line in lines if SSHD_KEYS.match(line)]}"
    )


def probe_lines(lines: list[str]) -> list[tuple[str, str]]:
    """The probe's ``ddp-node KEY: VALUE`` lines as (key, value), in order."""
    return [(match.group(1), match.group(2)) for match in filter(None, map(PROBE.match, lines))]


def record_of(probe: list[tuple[str, str]], workspace: str, container_workspace: str) -> str:
    """The node's record for every job's plan (JSON text): its cluster interface, address and network (the
    mesh lets that network's nodes in: a bridge network's addresses change when a container is made again),
    CPU binding, workspaces, and its host keys (the compiled cluster's known_hosts pins them, read once on the
    controller instead of from every host's facts)."""
    values = dict(probe)
    address = values.get("address", "")
    try:
        network = str(ipaddress.ip_interface(address).network) if address else ""
    except ValueError:
        network = ""  # the job's plan names a recorded address that is not one
    record = {
        "interface": values.get("interface", ""),
        "address": address,
        "network": network,
        "cpu_binding": values.get("cpu-binding", ""),
        "workspace": workspace,
        "container_workspace": container_workspace,
        "host_keys": host_keys(probe),
    }
    return json.dumps(record, indent=4, sort_keys=True) + "\n"


def host_keys(probe: list[tuple[str, str]]) -> dict[str, str]:
    """The node's host keys by type (ed25519: 'ssh-ed25519 AAAA...'), from the host-key-TYPE lines."""
    return {key[len("host-key-") :]: value for key, value in probe if key.startswith("host-key-") and value}


def files_of(probe: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """The reported files' sha256 and mode ({path: {sha256, mode}}), from the file lines."""
    files: dict[str, dict[str, Any]] = {}
    for key, value in probe:
        digest, mode, path = [*value.split(" ", 2), "", ""][:3]
        if key == "file" and path:
            files[path] = {"sha256": digest, "mode": int(mode, 8)}
    return files
