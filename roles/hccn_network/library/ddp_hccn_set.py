#!/usr/bin/python
"""Apply hccn_tool -s calls to NPU devices in one module call, stopping at the first failure."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ddp_hccn_set
short_description: Run the hccn_tool -s calls a role worked out, in order, in one call
description:
  - Runs C(hccn_tool -i DEVICE ARGS...) for each change, in the order given, and stops at the first that fails,
    naming the device, the call and hccn_tool's message.
  - Reports changed when there was anything to run; in check mode runs nothing and reports what it would run.
options:
  tool:
    description: hccn_tool, by path or by name on PATH.
    type: str
    required: true
  changes:
    description: Each with C(device) (int) and C(args) (the arguments after C(-i DEVICE), such as C(-ip -s ...)).
    type: list
    elements: dict
    required: true
"""

RETURN = r"""
applied:
  description: The calls that ran and succeeded, as argument lists.
  type: list
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402  (Ansible modules put DOCUMENTATION first)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "tool": {"type": "str", "required": True},
            "changes": {"type": "list", "elements": "dict", "required": True},
        },
        supports_check_mode=True,
    )
    tool = module.params["tool"]
    changes = module.params["changes"]
    calls = []
    for change in changes:
        if "device" not in change or not isinstance(change.get("args"), list) or "-s" not in change["args"]:
            module.fail_json(msg=f"each change needs device and args with -s, got {change!r}")
        calls.append([tool, "-i", str(int(change["device"]))] + [str(arg) for arg in change["args"]])
    if module.check_mode or not calls:
        module.exit_json(changed=bool(calls), applied=[], would_run=calls)
    resolved = module.get_bin_path(tool) if "/" not in tool else tool
    if resolved is None:
        module.fail_json(msg=f"{tool}: not found on PATH (give its full path)", applied=[])
    applied = []
    for argv in calls:
        rc, out, err = module.run_command([resolved, *argv[1:]])
        if rc != 0:
            module.fail_json(
                msg=f"device {argv[2]}: `{' '.join(argv)}` failed (rc {rc}): {(err or out).strip()}",
                applied=applied,
                changed=bool(applied),
            )
        applied.append(argv)
    module.exit_json(changed=True, applied=applied)


if __name__ == "__main__":
    main()
