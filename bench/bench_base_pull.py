"""Pulling a large base image: the image stage's pull (``ddp_image_pull``: the docker CLI, progress lines, the
bound) against a bare ``docker pull`` of the same image, side by side.

The image is made here: ddp-cluster/base:bookworm plus GIB layers of 1 GiB of random bytes (incompressible, as
a CANN or NGC image's libraries nearly are), pushed to Docker's Distribution registry on 127.0.0.1. Each round
removes the image and pulls it twice, once each way, the order flipping every round; only the pull is timed
(the stage's own report of its pull task, from ``playbooks/image.yml --tags training_image_base``).

    .venv/bin/python bench/bench_base_pull.py [--gib 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import PLAYBOOK, REPO, docker, table


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def make_image(name: str, gib: int, workdir: Path) -> None:
    lines = ["FROM ddp-cluster/base:bookworm"]
    for layer in range(gib):
        lines.append(f"RUN head -c 1073741824 /dev/urandom > /blob{layer}")
    (workdir / "Dockerfile").write_text("\n".join(lines) + "\n")
    subprocess.run(["docker", "build", "-q", "-t", name, str(workdir)], check=True, capture_output=True)


def stage_pull(image: str) -> float:
    """The image stage's pull of image: seconds its pull task reports."""
    env = os.environ | {"ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run(
        [PLAYBOOK, "playbooks/image.yml", "--tags", "training_image_base",
         "-e", f"cluster_base_image={image}"],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    found = re.search(rf"base image {re.escape(image)}: pulled in ([0-9.]+) s", done.stdout)
    if not found:
        raise SystemExit(f"the image stage did not pull {image}:\n{done.stdout[-3000:]}")
    return float(found.group(1))


def bare_pull(image: str) -> float:
    start = time.perf_counter()
    subprocess.run(["docker", "pull", "-q", image], check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddp-bench-pull-") as scratch:
        workdir = Path(scratch)
        port = free_port()
        (workdir / "config.yml").write_text(
            f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {workdir}/storage\n"
            f"http:\n  addr: 127.0.0.1:{port}\n"
        )
        serve = ["docker-registry", "serve", str(workdir / "config.yml")]
        registry = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        image = f"127.0.0.1:{port}/bench/large-base:{args.gib}g"
        try:
            time.sleep(1)
            make_image(image, args.gib, workdir)
            size = int(docker("image", "inspect", "-f", "{{.Size}}", image).strip())
            subprocess.run(["docker", "push", "-q", image], check=True, capture_output=True)
            times: dict[str, list[float]] = {"docker pull": [], "image stage": []}
            for round_ in range(args.rounds):
                order = ["docker pull", "image stage"] if round_ % 2 == 0 else ["image stage", "docker pull"]
                for way in order:
                    docker("rmi", image, check=False)
                    times[way].append(bare_pull(image) if way == "docker pull" else stage_pull(image))
        finally:
            registry.terminate()
            docker("rmi", image, check=False)
            docker("image", "prune", "-f", check=False)
    rows = [
        (way, f"{statistics.median(values):.1f} s", f"{size / statistics.median(values) / 1e6:.0f} MB/s",
         " ".join(f"{value:.1f}" for value in values))
        for way, values in times.items()
    ]  # fmt: skip
    print(
        f"base image of {size / 2**30:.1f} GiB ({args.gib} random 1 GiB layers) from a registry on 127.0.0.1"
    )
    print(table(rows, ("pull", "median", "rate", "runs")))
    ratio = statistics.median(times["image stage"]) / statistics.median(times["docker pull"])
    print(f"image stage / docker pull: {ratio:.2f}")


if __name__ == "__main__":
    main()
