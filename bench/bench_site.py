"""site.yml on the local inventory: cold, warm, a one-line python/ change, and bring-up of 2, 8 and 16 nodes.

Targets: warm re-run <= 20 s with changed=0 (2 nodes); image rebuild after a one-line change under python/
<= 30 s; 16 nodes within 2x the bring-up time of 2. "Cold" removes the node images and the build cache (the
base image and the controller's wheelhouse stay: they are downloads, not builds).

    .venv/bin/python bench/bench_site.py [--skip-cold]
"""

from __future__ import annotations

import argparse
import subprocess

from common import REPO, docker, playbook, table, teardown

TOUCHED = REPO / "python" / "src" / "ddp_cluster" / "__init__.py"


def remove_node_images() -> None:
    tags = docker("images", "--format", "{{.Repository}}:{{.Tag}}", "ddp-cluster/node").split()
    if tags:
        docker("rmi", "-f", *tags, check=False)
    subprocess.run(["docker", "builder", "prune", "-af"], capture_output=True, check=False)
    subprocess.run(["docker", "image", "prune", "-f"], capture_output=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-cold", action="store_true", help="keep the image (skip the cold build)")
    args = parser.parse_args()
    rows: list[tuple[str, ...]] = []

    teardown()
    if not args.skip_cold:
        remove_node_images()
        seconds, changed, _ = playbook("site.yml")
        rows.append(("cold site.yml (image built), 2 nodes", f"{seconds:.1f}", str(changed), ""))
    else:
        playbook("site.yml")

    seconds, changed, _ = playbook("site.yml")
    rows.append(("warm re-run, 2 nodes", f"{seconds:.1f}", str(changed), "<= 20 s, changed=0"))

    original = TOUCHED.read_text()
    try:
        TOUCHED.write_text(original + "# benchmark: a one-line change\n")
        seconds, changed, _ = playbook("site.yml", "--tags", "preflight,image")
        rows.append(
            ("image rebuild after a one-line python/ change", f"{seconds:.1f}", str(changed), "<= 30 s")
        )
        seconds, changed, _ = playbook("site.yml")
        rows.append(("  then site.yml (containers recreated, re-pinned)", f"{seconds:.1f}", str(changed), ""))
    finally:
        TOUCHED.write_text(original)
    playbook("site.yml")

    bring_up = {}
    for nodes in (2, 8, 16):
        teardown()
        seconds, changed, _ = playbook("site.yml", nodes=nodes)
        bring_up[nodes] = seconds
        rows.append((f"bring-up from no containers, {nodes} nodes", f"{seconds:.1f}", str(changed), ""))
    teardown()
    playbook("site.yml")

    print(table(rows, ("site.yml", "seconds", "changed", "target")))
    print(f"\n16 nodes / 2 nodes bring-up: {bring_up[16] / bring_up[2]:.2f}x (target: <= 2x)")


if __name__ == "__main__":
    main()
