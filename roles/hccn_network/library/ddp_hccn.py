#!/usr/bin/python
"""Read, compare and set the NPU device NICs of one server with hccn_tool, or verify them, in one module
call."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ddp_hccn
short_description: Read, compare and set Ascend device NIC settings with hccn_tool, or check their health
description:
  - The logic is ddp_cluster.ascend.hccn (shipped as module_utils), the same code as the role's filters and
  the
    C(ddp-cluster hccn) command.
  - C(mode=configure) reads every device's address, netdetect address and gateway (all before any is set),
    works out the C(hccn_tool -s) calls for what differs, and runs them in order, stopping at the first that
    fails. A read that fails sets nothing and is returned in C(failed_reads). Check mode runs no C(-s) and
    reports what it would; diff mode shows each setting before and after.
  - C(mode=verify) waits (one deadline for the server) until every device's net_health reads Success, then
    reads address, link and LLDP and returns the C(problems), one line per device; it changes nothing.
options:
  tool:
    description: hccn_tool, by path or by name on PATH.
    type: str
    required: true
  settings:
    description:
      - Per device, C(device), C(address), C(netmask), C(detect), C(gateway)
        (ddp_cluster.ascend.hccn.device_settings).
    type: list
    elements: dict
    required: true
  mode:
    description: configure (read, compare, set) or verify (health).
    type: str
    choices: [configure, verify]
    default: configure
  check_lldp:
    description: verify - require an LLDP neighbour on every device.
    type: bool
    default: true
  health_timeout:
    description: verify - seconds to wait for every device's net_health to read Success; 0 reads it once.
    type: int
    default: 0
  health_delay:
    description: verify - seconds between net_health polls.
    type: int
    default: 3
"""

RETURN = r"""
devices:
  description: Per device id (as a string), per query, the call's cmd, rc, stdout and stderr.
  type: dict
  returned: always
failed_reads:
  description: The reads that exited non-zero or could not run, with device, query, cmd, rc and stderr.
  type: list
  returned: always
changes:
  description: configure - the -s calls needed (device, setting, current, wanted, args, line), in the order
    run.
  type: list
  returned: always
applied:
  description: configure - the calls that ran and succeeded.
  type: list
  returned: always
problems:
  description: verify - why each device is not ready, one line per device with a problem.
  type: list
  returned: always
health_seconds:
  description: verify - seconds spent waiting for net_health.
  type: float
  returned: always
"""

import time  # noqa: E402  (Ansible modules put DOCUMENTATION first)
from typing import TYPE_CHECKING, Any  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

if TYPE_CHECKING:  # the same file: module_utils/ddp_hccn.py links to the package's module
    from ddp_cluster.ascend.hccn import change_line, healthy, problems
    from ddp_cluster.ascend.hccn import changes as hccn_changes
else:
    from ansible.module_utils.ddp_hccn import change_line, healthy, problems
    from ansible.module_utils.ddp_hccn import changes as hccn_changes


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "tool": {"type": "str", "required": True},
            "settings": {"type": "list", "elements": "dict", "required": True},
            "mode": {"type": "str", "default": "configure", "choices": ["configure", "verify"]},
            "check_lldp": {"type": "bool", "default": True},
            "health_timeout": {"type": "int", "default": 0},
            "health_delay": {"type": "int", "default": 3},
        },
        supports_check_mode=True,
    )
    tool = module.params["tool"]
    settings = module.params["settings"]
    devices = [int(setting["device"]) for setting in settings]
    resolved = module.get_bin_path(tool) if "/" not in tool else tool
    results: dict[str, dict[str, dict[str, Any]]] = {str(device): {} for device in devices}
    outcome: dict[str, Any] = {
        "devices": results,
        "failed_reads": [],
        "changes": [],
        "applied": [],
        "problems": [],
        "health_seconds": 0.0,
    }

    def read(device: int, query: str) -> dict[str, Any]:
        argv = [tool, "-i", str(device), query, "-g"]
        if resolved is None:
            entry = {
                "cmd": argv,
                "rc": 127,
                "stdout": "",
                "stderr": f"{tool}: not found (give its full path)",
            }
        else:
            try:
                rc, out, err = module.run_command([resolved, *argv[1:]])
            except Exception as exc:  # run_command raises for a missing executable in some versions
                rc, out, err = 127, "", str(exc)
            entry = {"cmd": argv, "rc": rc, "stdout": out, "stderr": err}
        results[str(device)][query] = entry
        return entry

    def failed_reads() -> list[dict[str, Any]]:
        return [
            {"device": int(device), "query": query, **entry}
            for device, by_query in results.items()
            for query, entry in by_query.items()
            if entry["rc"] != 0
        ]

    if module.params["mode"] == "verify":
        for query in ("-ip", "-link", "-lldp"):
            for device in devices:
                read(device, query)
        start = time.monotonic()
        deadline = start + max(0, module.params["health_timeout"])
        pending = list(devices)
        while True:
            pending = [device for device in pending if not healthy(read(device, "-net_health")["stdout"])]
            if not pending or time.monotonic() + module.params["health_delay"] > deadline:
                break
            time.sleep(max(0, module.params["health_delay"]))
        outcome["health_seconds"] = round(time.monotonic() - start, 1)
        outcome["failed_reads"] = failed_reads()
        outcome["problems"] = problems(settings, results, module.params["check_lldp"])
        module.exit_json(changed=False, **outcome)

    queries = ["-ip", "-netdetect"] + (
        ["-gateway"] if any(setting.get("gateway") for setting in settings) else []
    )
    for query in queries:
        for device in devices:
            read(device, query)
    outcome["failed_reads"] = failed_reads()
    if outcome["failed_reads"]:
        module.exit_json(changed=False, **outcome)  # nothing is set when any device could not be read
    needed = [dict(change, line=change_line(change)) for change in hccn_changes(settings, results)]
    outcome["changes"] = needed
    diff = {
        "before": "".join(f"device {c['device']} {c['setting']}: {c['current']}\n" for c in needed),
        "after": "".join(f"device {c['device']} {c['setting']}: {c['wanted']}\n" for c in needed),
    }
    if module.check_mode or not needed:
        module.exit_json(changed=bool(needed), diff=diff, **outcome)
    for change in needed:
        argv = [tool, "-i", str(change["device"]), *[str(arg) for arg in change["args"]]]
        rc, out, err = module.run_command([resolved, *argv[1:]])
        if rc != 0:
            module.fail_json(
                msg=f"device {change['device']}: `{' '.join(argv)}` failed (rc {rc}): {(err or out).strip()}",
                changed=bool(outcome["applied"]),
                **{key: value for key, value in outcome.items() if key != "changed"},
            )
        outcome["applied"].append(argv)
    module.exit_json(changed=True, diff=diff, **outcome)


if __name__ == "__main__":
    main()
