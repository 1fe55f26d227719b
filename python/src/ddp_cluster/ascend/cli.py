"""``ddp-cluster hccn``: what the hccn_network role would do to this server's device NICs, read-only.

    ddp-cluster hccn diff PLAN.yml --host NAME [--tool hccn_tool]     the -s calls needed (exit 1 when any)
    ddp-cluster hccn check PLAN.yml --host NAME [--tool hccn_tool]    devices not ready (exit 1 when any)

PLAN.yml is a device-IP plan (``ddp-cluster ip-plan check``'s format); NAME the server's ``host`` in it. The
devices are read with hccn_tool on this machine, the same way and with the same code
(:mod:`ddp_cluster.ascend.hccn`)
as the role; nothing is set.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Sequence

from ddp_cluster.ascend import hccn
from ddp_cluster.ascend.ipplan import plan_to_dict, read_plan_or_report
from ddp_cluster.text import plain

PROG = "ddp-cluster hccn"


def run(argv: list[str]) -> tuple[int, str, str]:
    """One hccn_tool call on this machine: rc, stdout, stderr (rc 127 when it cannot run)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return 127, "", str(error)
    return done.returncode, done.stdout, done.stderr


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=plain(__doc__).split("\n\n")[0])
    parser.add_argument("action", choices=["diff", "check"])
    parser.add_argument("plan", metavar="PLAN.yml")
    parser.add_argument("--host", required=True, help="the server's host name in the plan")
    parser.add_argument("--tool", default="hccn_tool", help="hccn_tool, by path or name (default: on PATH)")
    parser.add_argument("--no-lldp", action="store_true", help="check: do not require an LLDP neighbour")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    plan = read_plan_or_report(args.plan, PROG)
    if plan is None:
        return 2
    try:
        settings = hccn.device_settings(plan_to_dict(plan), args.host)
    except hccn.HccnError as error:
        print(f"{PROG}: {args.plan}: {error}", file=sys.stderr)
        return 2
    if shutil.which(args.tool) is None:
        print(
            f"{PROG}: {args.tool} is not found on this machine (not on PATH, or not executable): run this"
            " on the Ascend server itself, where the driver installs it (/usr/local/Ascend/driver/tools),"
            " or give --tool PATH",
            file=sys.stderr,
        )
        return 2
    devices = [int(setting["device"]) for setting in settings]
    queries = (
        ("-ip", "-netdetect", "-gateway")
        if args.action == "diff"
        else ("-ip", "-link", "-lldp", "-net_health")
    )
    readings = hccn.read_devices(args.tool, devices, queries, run)
    failed = [(d, q, e) for d, by_query in readings.items() for q, e in by_query.items() if e["rc"] != 0]
    if failed:
        # one line per distinct answer: 32 calls that failed alike say it once, with how many
        said: dict[tuple[int, str], list[str]] = {}
        for device, query, entry in failed:
            said.setdefault((entry["rc"], entry["stderr"].strip()), []).append(f"-i {device} {query}")
        for (rc, stderr), calls in said.items():
            which = calls[0] if len(calls) == 1 else f"{len(calls)} calls ({calls[0]}, ...)"
            print(f"{PROG}: {args.tool} {which} -g: rc {rc}: {stderr}", file=sys.stderr)
        return 2
    if args.action == "diff":
        lines = [hccn.change_line(change) for change in hccn.changes(settings, readings)]
    else:
        lines = hccn.problems(settings, readings, check_lldp=not args.no_lldp)
    for line in lines:
        print(line)
    if not lines:
        print(f"{args.host}: {'nothing to set' if args.action == 'diff' else 'every device ready'}")
    return 1 if lines else 0
