#!/usr/bin/python
"""Read, compare and set the NPU device NICs of one server with hccn_tool, or verify them, in one module
call."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ddp_hccn
short_description: Read, compare and set Ascend device NIC settings with hccn_tool, or check their health
description:
  - The logic is ddp_cluster.ascend.hccn (shipped as module_utils), the same code as the role's filters and
    the C(ddp-cluster hccn) command.
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

from typing import TYPE_CHECKING  # noqa: E402  (Ansible modules put DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

if TYPE_CHECKING:  # the same file: module_utils/ddp_hccn.py links to the package's module
    from ddp_cluster.ascend.hccn import configure, verify
else:
    from ansible.module_utils.ddp_hccn import configure, verify


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
    params = module.params
    tool = params["tool"]
    resolved = module.get_bin_path(tool) if "/" not in tool else tool

    def run(argv: list[str]) -> tuple[int, str, str]:
        if resolved is None:
            return 127, "", f"{tool}: not found (give its full path)"
        try:
            rc, out, err = module.run_command([resolved, *argv[1:]])
        except Exception as exc:  # run_command raises for a missing executable in some versions
            return 127, "", str(exc)
        return rc, out, err

    if params["mode"] == "verify":
        checked = verify(
            tool,
            params["settings"],
            run,
            params["check_lldp"],
            params["health_timeout"],
            params["health_delay"],
        )
        module.exit_json(changed=False, **checked)
    outcome, failure = configure(tool, params["settings"], run, module.check_mode)
    if failure:
        module.fail_json(msg=failure, **outcome)
    module.exit_json(**outcome)


if __name__ == "__main__":
    main()
