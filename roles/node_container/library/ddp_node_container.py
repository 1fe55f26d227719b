#!/usr/bin/python
"""Bring one node up in one module run: its directories, its settings file, its container, and sshd's
check."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ddp_node_container
short_description: A node's directories, settings file and container, and the check that its sshd answers
description:
  - One module run per node for the whole container stage (each module run costs the controller about half a
    second of CPU; the stage was eight per node). Directories are made or re-moded, the settings file written
    only when its content or mode differs (to a temporary file renamed over the old one), the container
    created with the docker CLI only when it is missing or was created from another specification, started
    when stopped, then the module waits for sshd to listen on the cluster port and reads its effective
    configuration and the node's network (the lines of O(sshd.probe)).
  - The container's specification (the image's id included) is kept in its label C(ddp-cluster.spec); a
    container whose label differs from the one asked for is removed and created again, so a new image, a
    changed volume or variable, or a container made by hand under the node's name is replaced, and an
    unchanged one is left running.
  - Check mode says what would change and changes nothing; diff mode shows the settings file and the
    specification before and after.
options:
  directories:
    description: Each C(path) and C(mode) (octal string), owned by root.
    type: list
    elements: dict
    required: true
  settings:
    description: The node settings file, C(path), C(content) and C(mode).
    type: dict
    required: true
  container:
    description:
      - C(name), C(hostname), C(image), C(restart_policy), C(init), C(ipc_mode), C(shm_size), C(ulimits)
        (C(name:soft:hard)), C(runtime), C(env), C(network) (a network name, or C(host)), C(aliases),
        C(etc_hosts) (name to address), C(volumes), C(devices), C(device_requests) (as community.docker's
        docker_container takes them) and C(labels).
    type: dict
    required: true
  sshd:
    description: C(port), C(timeout) (seconds), C(files) and C(probe) (a shell script run with the port as
      $0 and the files as its arguments; it exits 0 once sshd is ready and prints C(sshd -T)'s lines and
      one line per fact the action reads, C(ddp-node KEY), a colon, the value).
    type: dict
    required: true
"""

RETURN = r"""
actions:
  description: What was done (or would be, in check mode), in order.
  type: list
  returned: always
sshd:
  description: The probe's output lines, once sshd answered (empty when it did not, or in check mode before
    the container exists).
  type: list
  returned: always
"""

import csv  # noqa: E402  (Ansible modules put DOCUMENTATION first)
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

SPEC_LABEL = "ddp-cluster.spec"
DOCKER_TIMEOUT = 120
NO_DOCKER_CLI = (
    "the docker CLI is not on this server's PATH: install it with the engine (docker-ce-cli, or Debian's "
    "docker.io)"
)


class Failure(Exception):
    pass


def docker(
    *args: str, check: bool = True, timeout: float = DOCKER_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False, timeout=timeout)
    except FileNotFoundError as error:
        raise Failure(NO_DOCKER_CLI) from error
    except subprocess.TimeoutExpired as error:
        raise Failure(f"`docker {' '.join(args[:2])}` did not answer within {timeout:.0f} s") from error
    if check and done.returncode != 0:
        raise Failure(f"`docker {' '.join(args)}` failed: {(done.stderr or done.stdout).strip()}")
    return done


def directories(entries: list[dict[str, Any]], check: bool) -> list[str]:
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
            raise Failure(f"{path} exists and is not a directory: move it away")
        if stat.S_IMODE(info.st_mode) != mode or (info.st_uid, info.st_gid) != (0, 0):
            actions.append(f"set {path} to {entry['mode']} root:root")
            if not check:
                os.chmod(path, mode)
                os.chown(path, 0, 0)
    return actions


def settings_file(spec: dict[str, Any], check: bool, diff: dict[str, Any]) -> list[str]:
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
        directory = os.path.dirname(path)
        descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=".ddp-node-")
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
        raise Failure(
            "node_container_device_requests: an entry lists more than one set of capabilities; give one set, "
            "e.g. capabilities: [[gpu, utility, compute]]"
        )
    if capabilities:
        fields.append("capabilities=" + ",".join(capabilities[0]))
    if request.get("options"):
        raise Failure("node_container_device_requests: options are not supported; leave them out")
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


def container(spec: dict[str, Any], check: bool, diff: dict[str, Any]) -> tuple[list[str], bool]:
    """Create, replace or start the node's container: (actions, whether it runs or will)."""
    image = docker("image", "inspect", "--format", "{{.Id}}", spec["image"], check=False)
    if image.returncode != 0:
        if check:  # the image stage, in check mode too, only said it would build it
            return [
                f"would create container {spec['name']} from {spec['image']} (not on this engine yet)"
            ], False
        raise Failure(
            f"image {spec['image']} is not on this server's engine: run the image stage first "
            "(ansible-playbook site.yml --tags image), or set node_container_image to an image it has"
        )
    wanted = json.dumps({**spec, "image_id": image.stdout.strip()}, sort_keys=True, separators=(",", ":"))
    found = docker("container", "inspect", spec["name"], check=False)
    actions = []
    if found.returncode == 0:
        info = json.loads(found.stdout)[0]
        label = (info["Config"].get("Labels") or {}).get(SPEC_LABEL, "")
        if label == wanted:
            if info["State"].get("Running"):
                return [], True
            actions.append(f"started container {spec['name']}")
            if not check:
                docker("start", spec["name"])
            return actions, not check
        diff["before"]["container"] = json.loads(label) if label.startswith("{") else "(made elsewhere)"
        actions.append(f"removed container {spec['name']} (its specification differs)")
        if not check:
            docker("rm", "--force", spec["name"])
    diff["after"]["container"] = json.loads(wanted)
    actions.append(f"created and started container {spec['name']} from {spec['image']}")
    if not check:
        docker(*run_argv(spec, wanted))
        docker("start", spec["name"])
    return actions, not check


def wait_for_sshd(name: str, sshd: dict[str, Any]) -> tuple[list[str], str]:
    """The probe's lines once it exits 0 within the timeout; else ([], why)."""
    deadline = time.monotonic() + float(sshd["timeout"])
    why = ""
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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "directories": {"type": "list", "elements": "dict", "required": True},
            "settings": {"type": "dict", "required": True},
            "container": {"type": "dict", "required": True},
            "sshd": {"type": "dict", "required": True},
        },
        supports_check_mode=True,
    )
    params, check = module.params, module.check_mode
    diff: dict[str, Any] = {"before": {}, "after": {}}
    try:
        if shutil.which("docker") is None:
            raise Failure(NO_DOCKER_CLI)
        actions = directories(params["directories"], check)
        actions += settings_file(params["settings"], check, diff)
        done, running = container(params["container"], check, diff)
        actions += done
        container_changed = bool(done)
        lines, why = wait_for_sshd(params["container"]["name"], params["sshd"]) if running else ([], "")
    except Failure as error:
        module.fail_json(msg=f"{params['container'].get('name', '?')}: {error}")
    result: dict[str, Any] = {
        "changed": bool(actions),
        "actions": actions,
        "container_changed": container_changed,
        "sshd": lines,
        "sshd_error": why,
    }
    if module._diff and actions:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
