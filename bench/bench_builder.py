"""Where the node image is built (cluster_image_builder): on the controller (the registry path of
the controller's registry, every server pulls through its tunnel) against on a server (the build
server's engine builds from a context sent by the controller; the others pull from a registry on it over the
cluster's own network), side by side, on 2 and 4 simulated servers, each fresh with the base image on every
server (as at an Ascend site, where the CANN base is loaded on each).

For each: the first image stage (`site.yml --tags preflight,hosts,image`, the build included) and a one-line
change under python/ (`--tags image`): wall time; the bytes the controller's own processes sent to the servers
(an iptables counter on OUTPUT to the sim network: ssh, Ansible's modules and copies, the registry's tunnels);
the bytes the sim bridge received through the controller from elsewhere (the servers' package archive, which
the sim reaches through this machine's NAT; at a site, the servers' own mirror); and the bytes the build
server's registry served to the others (server builds: they never cross the controller).

    .venv/bin/python bench/bench_builder.py [--servers 2 4] [--json FILE]

It starts and removes the simulated servers itself (make sim-up / sim-down).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Iterator

from bench_distribution import TOUCHED, bridge_tx, mb, run, sim
from common import over_server_counts, table

BASE = "ddp-cluster/base:bookworm"


def fresh(servers: int) -> None:
    """Fresh servers, each with the base image loaded (not through the controller's tunnel: docker exec)."""
    sim("down", servers)
    sim("up", servers)
    for index in range(servers):
        subprocess.run(f"docker save {BASE} | docker exec -i sim-server{index} docker load",
                       shell=True, check=True, capture_output=True)  # fmt: skip


SIM_NETWORK = "172.30.99.0/24"  # scripts/sim.sh
COUNTER = ["OUTPUT", "-d", SIM_NETWORK, "-m", "comment", "--comment", "ddp-bench-builder"]


@contextlib.contextmanager
def controller_counter() -> Iterator[None]:
    """An iptables rule without a target (it only counts) on what this machine's own processes send to the
    sim."""
    subprocess.run(["iptables", "-I", *COUNTER], check=True)
    try:
        yield
    finally:
        subprocess.run(["iptables", "-D", *COUNTER], check=False)


def controller_sent() -> int:
    listing = subprocess.run(["iptables", "-L", "OUTPUT", "-v", "-x", "-n"], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    return sum(int(line.split()[1]) for line in listing.splitlines() if "ddp-bench-builder" in line)


def measure(servers: int, builder: str, label: str, *args: str) -> tuple[tuple[str, ...], float]:
    own, bridge = controller_sent(), bridge_tx()
    seconds, _, out = run(servers, *args, "-e", f"cluster_image_builder={builder}", "-v")
    own, bridge = controller_sent() - own, bridge_tx() - bridge
    served = sum(int(n) for n in re.findall(r"bytes_served: (\d+)", out))
    pulled = ",".join(re.findall(r"layers_pulled: (\d+)", out))
    row = (f"{servers} servers", builder, label, f"{seconds:.1f}", mb(own), mb(own // servers),
           mb(max(0, bridge - own)), mb(served) if builder == "server" else "-", pulled)  # fmt: skip
    print(" | ".join(row), flush=True)  # as it comes: a later failure keeps what was measured
    return row, seconds


def bench(servers: int) -> tuple[list[tuple[str, ...]], dict[str, float]]:
    rows: list[tuple[str, ...]] = []
    figures: dict[str, float] = {}
    original = TOUCHED.read_text()
    for builder in ("controller", "server"):
        fresh(servers)
        row, figures[f"{builder}: first image stage"] = measure(
            servers, builder, "first image stage", "site.yml", "--tags", "preflight,hosts,image"
        )
        rows.append(row)
        try:
            TOUCHED.write_text(original + f"# benchmark: a one-line change for {builder}\n")
            row, figures[f"{builder}: one-line change"] = measure(
                servers, builder, "one-line change", "site.yml", "--tags", "image"
            )
            rows.append(row)
        finally:
            TOUCHED.write_text(original)
    sim("down", servers)
    return rows, figures


def main() -> None:
    with controller_counter():
        rows, figures = over_server_counts(__doc__ or "", bench)
    header = ("cluster", "builder", "case", "seconds", "MB from controller", "per server",
              "MB archive via NAT", "MB server-to-server", "layers pulled")  # fmt: skip
    print(table(rows, header))
    if 2 in figures and 4 in figures:
        for case in ("server: first image stage", "server: one-line change"):
            print(
                f"{case}, 4 servers / 2 servers: {figures[4][case] / figures[2][case]:.2f}x (target <= 1.3x)"
            )


if __name__ == "__main__":
    main()
