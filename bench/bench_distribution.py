"""The node image on simulated servers: registry against save/load, side by side, for 2 and 4 servers.

For each server count: the first distribution to servers without the image (save/load, then the registry with
an empty store, then the registry again with the layers already pushed), a one-line change under python/
shipped to servers that hold the previous image (registry, then save/load), and site.yml's warm re-run. Wall
time of `site.yml --tags image` (the image stage: the build when needed, then the shipping), and the bytes
leaving the controller for the servers (transmitted on the sim network's bridge, so Ansible's own traffic is
in it too).

    .venv/bin/python bench/bench_distribution.py [--servers 2 4]

It starts and removes the simulated servers itself (make sim-up / sim-down).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from common import PLAYBOOK, REPO, over_server_counts, table

TOUCHED = REPO / "python" / "src" / "ddp_cluster" / "__init__.py"
REGISTRY_STORE = REPO / "build" / "registry"


def sim(action: str, servers: int) -> None:
    env = os.environ | {"SIM_SERVERS": str(servers), "PYTHON": str(REPO / ".venv" / "bin" / "python")}
    subprocess.run(["scripts/sim.sh", action], cwd=REPO, env=env, check=True, capture_output=True)


def bridge_tx() -> int:
    network = subprocess.run(
        ["docker", "network", "inspect", "-f", "{{.Id}}", "ddp-sim"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return int(Path(f"/sys/class/net/br-{network[:12]}/statistics/tx_bytes").read_text())


def run(servers: int, *args: str) -> tuple[float, int, str]:
    """ansible-playbook on the sim inventory (plus build/sim/hosts.yml beyond two servers): seconds, bytes
    out."""
    inventory = ["-i", "inventories/sim"] + (["-i", "build/sim/hosts.yml"] if servers > 2 else [])
    env = os.environ | {"ANSIBLE_NOCOLOR": "1"}
    before, start = bridge_tx(), time.perf_counter()
    done = subprocess.run([PLAYBOOK, *inventory, *args], cwd=REPO, env=env, capture_output=True, text=True)
    seconds, sent = time.perf_counter() - start, bridge_tx() - before
    if done.returncode != 0:
        raise SystemExit(
            f"ansible-playbook {' '.join(args)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
        )
    return seconds, sent, done.stdout


def on_servers(servers: int, command: str) -> None:
    for index in range(servers):
        subprocess.run(
            ["docker", "exec", f"sim-server{index}", "sh", "-c", command], check=True, capture_output=True
        )


# The sim inventory's name for the node image (inventories/sim/group_vars/all.yml).
NODE_IMAGE = "ddp-cluster/sim-node"


def forget_images(servers: int) -> None:
    """Servers without any node image (and its layers), as before the first distribution."""
    on_servers(servers, f"docker rm -f $(hostname) >/dev/null 2>&1; docker image ls -q {NODE_IMAGE} "
               "| xargs -r docker rmi -f >/dev/null; docker image prune -f >/dev/null")  # fmt: skip


def image_size() -> int:
    latest = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", f"{NODE_IMAGE}:latest"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    return int(latest.stdout)


def mb(count: int) -> str:
    return f"{count / 1e6:.1f}"


def bench(servers: int) -> tuple[list[tuple[str, ...]], dict[str, float]]:
    rows: list[tuple[str, ...]] = []
    figures: dict[str, float] = {}
    sim("down", servers)
    sim("up", servers)
    run(servers, "site.yml", "--tags", "preflight,hosts,image", "-e", "cluster_image_distribution=save_load")
    size = image_size()

    def ship(label: str, method: str, *extra: str) -> None:
        seconds, sent, out = run(servers, "site.yml", "--tags", "image",
                                 "-e", f"cluster_image_distribution={method}", *extra)  # fmt: skip
        rows.append((f"{servers} servers", label, f"{seconds:.1f}", mb(sent), mb(sent // servers),
                     f"{100 * sent / servers / size:.2f}"))  # fmt: skip
        figures[label] = seconds
        pulled = re.findall(r"layers_pulled: (\d+)", out)
        if pulled:
            rows[-1] = (*rows[-1][:1], f"{label} (layers pulled: {','.join(pulled)})", *rows[-1][2:])
        print(" | ".join(rows[-1]), flush=True)  # as it comes: a later failure keeps what was measured

    forget_images(servers)
    ship("first: save/load", "save_load")
    forget_images(servers)
    shutil.rmtree(REGISTRY_STORE, ignore_errors=True)
    ship("first: registry, empty store", "registry", "-v")
    forget_images(servers)
    ship("first: registry, layers pushed before", "registry", "-v")

    original = TOUCHED.read_text()
    try:
        TOUCHED.write_text(original + "# benchmark: a one-line change\n")
        ship("one-line change: registry", "registry", "-v")
        TOUCHED.write_text(original + "# benchmark: another one-line change\n")
        ship("one-line change: save/load", "save_load")
    finally:
        TOUCHED.write_text(original)

    run(servers, "site.yml")
    seconds, sent, _ = run(servers, "site.yml")
    rows.append(
        (f"{servers} servers", "site.yml warm re-run", f"{seconds:.1f}", mb(sent), mb(sent // servers), "")
    )
    print(" | ".join(rows[-1]), flush=True)
    figures["warm"] = seconds
    sim("down", servers)
    return rows, figures


def main() -> None:
    rows, figures = over_server_counts(__doc__ or "", bench)
    print(table(rows, ("cluster", "case", "seconds", "MB out", "MB out/server", "% of image/server")))
    if 2 in figures and 4 in figures:
        ratio = figures[4]["warm"] / figures[2]["warm"]
        print(f"\nwarm site.yml, 4 servers / 2 servers: {ratio:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
