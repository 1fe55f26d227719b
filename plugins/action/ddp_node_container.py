"""Action ``ddp_node_container``: the node_container role's one module run per node, then on the controller
(no second module run) the check of sshd's configuration and the node's record that every job's plan reads
(``record.path``: its interface, address, CPU binding and workspace).

The module (roles/node_container/library/ddp_node_container.py) makes the node's directories, settings file
and container and reads sshd's effective configuration; this action fails with what is wrong when sshd did
not answer in time or is not configured as the cluster needs (port, password and keyboard-interactive login
off, root by key only), and writes the record only when its content differs. Check mode writes nothing.
"""

from __future__ import annotations

import json
import os
import re
import site
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.files import write_atomic

SSHD_KEYS = re.compile(r"^(port|passwordauthentication|kbdinteractiveauthentication|permitrootlogin) ")
PROBE = re.compile(r"^ddp-node ([a-z0-9-]+): ?(.*)$")


def expected_sshd(port: int) -> list[str]:
    return [
        f"port {port}",
        "passwordauthentication no",
        "kbdinteractiveauthentication no",
        "permitrootlogin without-password",
    ]


def probe_lines(lines: list[str]) -> list[tuple[str, str]]:
    """The probe's ``ddp-node KEY: VALUE`` lines as (key, value), in order."""
    return [(match.group(1), match.group(2)) for match in filter(None, map(PROBE.match, lines))]


def record_of(probe: list[tuple[str, str]], base: dict[str, Any]) -> dict[str, Any]:
    values = dict(probe)
    return {
        "interface": values.get("interface", ""),
        "address": values.get("address", ""),
        "cpu_binding": values.get("cpu-binding", ""),
        "workspace": base["workspace"],
        "container_workspace": base["container_workspace"],
    }


def host_keys(probe: list[tuple[str, str]]) -> dict[str, str]:
    """The node's host keys by type (ed25519: 'ssh-ed25519 AAAA...'), from the host-key-TYPE lines."""
    return {
        key.removeprefix("host-key-"): value for key, value in probe if key.startswith("host-key-") and value
    }


def files_of(probe: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """The reported files' sha256 and mode ({path: {sha256, mode}}), from the file lines."""
    files: dict[str, dict[str, Any]] = {}
    for key, value in probe:
        digest, mode, path = [*value.split(" ", 2), "", ""][:3]
        if key == "file" and path:
            files[path] = {"sha256": digest, "mode": int(mode, 8)}
    return files


def write_record(path: str, content: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_atomic(Path(path), content.encode())
    os.chmod(path, 0o644)


class ActionModule(ActionBase):
    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        record = args.pop("record")
        host = (task_vars or {}).get("inventory_hostname", "?")
        result.update(
            self._execute_module(module_name="ddp_node_container", module_args=args, task_vars=task_vars)
        )
        if result.get("failed"):
            return result
        lines, port = result.get("sshd") or [], int(args["sshd"]["port"])
        container = args["container"]["name"]
        if not lines:
            if self._play_context.check_mode:  # the container does not run yet: nothing to check
                return result
            raise AnsibleActionFail(
                f"{host}: sshd in container {container} did not answer on port {port} within "
                f"{args['sshd']['timeout']} s ({result.get('sshd_error') or 'no output'}): read "
                f"`docker logs {container}` on the server"
            )
        missing = [line for line in expected_sshd(port) if line not in lines]
        if missing:
            raise AnsibleActionFail(
                f"{host}: sshd in container {container} is not configured as the cluster needs (port {port}, "
                f"password login off, root by key only): it lacks {missing}; `sshd -T` says "
                f"{[line for line in lines if SSHD_KEYS.match(line)]}"
            )
        probe = probe_lines(lines)
        result["ansible_facts"] = {
            "ddp_node_host_keys": host_keys(probe),
            "ddp_node_files": files_of(probe),
            "ddp_node_changed": bool(result.get("container_changed")),
        }
        content = json.dumps(record_of(probe, record), indent=4, sort_keys=True) + "\n"
        try:
            with open(record["path"], encoding="utf-8") as handle:
                before = handle.read()
        except FileNotFoundError:
            before = ""
        if before != content:
            result["changed"] = True
            result.setdefault("actions", []).append(f"recorded the node in {record['path']}")
            if self._play_context.diff:
                result.setdefault("diff", {"before": {}, "after": {}})
                result["diff"]["before"]["record"], result["diff"]["after"]["record"] = before, content
            if not self._play_context.check_mode:
                write_record(record["path"], content)
        return result
