#!/usr/bin/python
"""Read hccn_tool settings of many NPU devices in one module call, optionally waiting for net_health."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ddp_hccn_query
short_description: Read NPU device NIC settings with hccn_tool, all devices in one call
description:
  - Runs C(hccn_tool -i N QUERY -g) for every device and query and returns each output, so a role reads a whole
    server with one task instead of one per device and query.
  - With O(health_timeout), polls C(-net_health -g) of every device not yet at C(Success) until all are, or the
    time is up (one deadline for the whole server); the last answers are returned either way.
  - Read-only; never fails because a device or the tool does; the caller checks C(failed_reads).
options:
  tool:
    description: hccn_tool, by path or by name on PATH.
    type: str
    required: true
  devices:
    description: Device ids (0~7).
    type: list
    elements: int
    required: true
  queries:
    description: Settings to read; C(-net_health) is read last, after any waiting.
    type: list
    elements: str
    choices: [-ip, -netdetect, -gateway, -link, -lldp, -net_health]
    required: true
  health_timeout:
    description: Seconds to wait for every device's net_health to read Success; 0 reads it once.
    type: int
    default: 0
  health_delay:
    description: Seconds between net_health polls.
    type: int
    default: 3
"""

RETURN = r"""
devices:
  description: Per device id (as a string), per query, the call's rc, stdout and stderr.
  type: dict
  returned: always
failed_reads:
  description: The calls that exited non-zero or could not run, with device, query, cmd, rc and stderr.
  type: list
  returned: always
health_seconds:
  description: Seconds spent waiting for net_health.
  type: float
  returned: always
"""

import time  # noqa: E402  (Ansible modules put DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def healthy(output: str) -> bool:
    """`net health status: Success` (some tool versions print the code: 0)."""
    for line in output.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "net health status":
            return value.strip() in ("Success", "0")
    return False


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "tool": {"type": "str", "required": True},
            "devices": {"type": "list", "elements": "int", "required": True},
            "queries": {
                "type": "list",
                "elements": "str",
                "required": True,
                "choices": ["-ip", "-netdetect", "-gateway", "-link", "-lldp", "-net_health"],
            },
            "health_timeout": {"type": "int", "default": 0},
            "health_delay": {"type": "int", "default": 3},
        },
        supports_check_mode=True,
    )
    tool = module.params["tool"]
    devices = module.params["devices"]
    queries = module.params["queries"]
    resolved = module.get_bin_path(tool) if "/" not in tool else tool
    results: dict[str, dict[str, dict]] = {str(device): {} for device in devices}

    def read(device: int, query: str) -> dict:
        argv = [resolved or tool, "-i", str(device), query, "-g"]
        try:
            rc, out, err = module.run_command(argv)
        except Exception as exc:  # run_command raises for a missing executable in some versions
            rc, out, err = 127, "", str(exc)
        entry = {"cmd": argv, "rc": rc, "stdout": out, "stderr": err}
        results[str(device)][query] = entry
        return entry

    if resolved is None:
        for device in devices:
            for query in queries:
                results[str(device)][query] = {
                    "cmd": [tool, "-i", str(device), query, "-g"],
                    "rc": 127,
                    "stdout": "",
                    "stderr": f"{tool}: not found (give its full path)",
                }
    else:
        for query in queries:
            if query != "-net_health":
                for device in devices:
                    read(device, query)
    waited = 0.0
    if resolved is not None and "-net_health" in queries:
        start = time.monotonic()
        deadline = start + max(0, module.params["health_timeout"])
        pending = list(devices)
        while True:
            pending = [device for device in pending if not healthy(read(device, "-net_health")["stdout"])]
            if not pending or time.monotonic() + module.params["health_delay"] > deadline:
                break
            time.sleep(max(0, module.params["health_delay"]))
        waited = round(time.monotonic() - start, 1)
    failed = [
        {"device": int(device), "query": query, **entry}
        for device, by_query in results.items()
        for query, entry in by_query.items()
        if entry["rc"] != 0
    ]
    module.exit_json(changed=False, devices=results, failed_reads=failed, health_seconds=waited)


if __name__ == "__main__":
    main()
