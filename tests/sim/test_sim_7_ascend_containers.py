"""The node containers on the Ascend servers: ascend-docker-runtime where the engine has it and devices and
mounts elsewhere, the ranks bound to their devices' CPUs (NUMA), what a node needs to train on the CANN base,
and the image stage refusing requirements that would shadow the base's numpy."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import (
    CANN_PYTHON,
    CANN_SITE,
    RUNS,
    SERVERS,
    SIM_ASCEND,
    VERSIONS,
    job_id,
    on_node,
    on_server,
    train,
)
from conftest import REPO, PlaybookResult, run_playbook


def test_ascend_runtime_where_the_engine_has_it_and_devices_and_mounts_elsewhere(
    ascend_cluster: PlaybookResult,
) -> None:
    inspect = "docker inspect -f '{{json .HostConfig}} {{json .Config.Env}}' "
    host0, env0 = on_server("sim-server0", inspect + "sim-server0").stdout.split(" ", 1)
    host1, env1 = on_server("sim-server1", inspect + "sim-server1").stdout.split(" ", 1)
    config0, config1 = json.loads(host0), json.loads(host1)
    # With the runtime: asked for by name, ASCEND_VISIBLE_DEVICES in the container's own environment, no
    # explicit devices; the runtime (the stand-in, as the real one) made the device nodes and the mounts.
    assert config0["Runtime"] == "ascend"
    assert "ASCEND_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in json.loads(env0)
    assert not config0["Devices"]
    assert "create sim-server0: devices [0, 1, 2, 3, 4, 5, 6, 7]" in on_server(
        "sim-server0", "cat /var/log/ascend-docker-runtime.log"
    ).stdout.replace(
        on_server("sim-server0", "docker inspect -f '{{.Id}}' sim-server0").stdout.strip(), "sim-server0"
    )
    # (The runtime edits the container's first process; docker exec takes its environment from Docker's
    # config.)
    seen = on_node("sim-server0", "ls /dev/davinci0 /dev/davinci7 /dev/davinci_manager"
                   " && tr '\\0' '\\n' < /proc/1/environ | sed -n 's/^ASCEND_DOCKER_RUNTIME=//p'"
                   " && grep -c ' /var/queue_schedule ' /proc/mounts")  # fmt: skip
    assert seen.stdout.split()[-2:] == ["True", "1"], seen.stdout
    # Without: runc, the devices given explicitly and the runtime's base.list paths mounted read-only.
    assert config1["Runtime"] == "runc"
    assert "ASCEND_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" not in json.loads(env1)
    assert {device["PathOnHost"] for device in config1["Devices"]} >= {
        "/dev/davinci0", "/dev/davinci7", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"
    }  # fmt: skip
    assert {"/var/queue_schedule:/var/queue_schedule:ro", "/usr/local/dcmi:/usr/local/dcmi:ro"} <= set(
        config1["Binds"]
    )
    for server in SERVERS:
        # The variable does nothing in node.env: it is not there.
        assert (
            on_node(server, "grep -c ASCEND_VISIBLE_DEVICES /etc/ddp-cluster/node/node.env || true").stdout
            == "0\n"
        )


def test_ascend_ranks_are_bound_to_their_devices_cpus_from_the_topology(
    ascend_cluster: PlaybookResult,
) -> None:
    job = job_id("npu-numa")
    result = train(job, SIM_ASCEND, nodes=2, device="cpu", cluster_nproc_per_node=2,
                   script=str(REPO / "tests" / "scripts" / "affinity_probe.py"))  # fmt: skip
    assert result.rc == 0, result.stdout[-5000:]
    flat = " ".join(result.stdout.split())
    said = (
        "ranks bound to the CPUs of their devices (cluster_cpu_binding numa; device=CPUs):"
        " sim-server0 0=1;1=0;"
    )
    assert said in flat, flat[-3000:]
    reports = [
        json.loads(line.split("affinity-probe ", 1)[1])
        for log in sorted((RUNS / job / "logs").glob("rank.*.log"))
        for line in log.read_text().splitlines()
        if "affinity-probe {" in line
    ]
    assert sorted((r["node"], r["local_rank"], r["affinity"]) for r in reports) == [
        ("sim-server0", 0, [1]), ("sim-server0", 1, [0]), ("sim-server1", 0, [1]), ("sim-server1", 1, [0])
    ], reports  # fmt: skip
    assert all(r["taskset"].endswith(f"current affinity list: {r['affinity'][0]}") for r in reports), reports


def test_ascend_node_gets_what_real_training_needs(ascend_cluster: PlaybookResult) -> None:
    for server in SERVERS:
        template = "'{{.HostConfig.IpcMode}} {{range .HostConfig.Ulimits}}{{.Name}}={{.Soft}} {{end}}'"
        # memlock stays at the VM's hard limit here (no CAP_SYS_RESOURCE; see inventories/sim-ascend).
        assert on_server(server, f"docker inspect -f {template} {server}").stdout.split() == [
            "host",
            "stack=67108864",
        ]
        # npu-smi where ascend-docker-runtime mounts it, found on the host.
        assert "Total Count" in on_node(server, "npu-smi info -l").stdout
        assert on_node(server, "command -v npu-smi").stdout.strip() == "/usr/local/sbin/npu-smi"
        # The venv is made with the Python the CANN base puts first on PATH (built into
        # /usr/local/python3.11.2), keeps the base's numpy 1.24.0, and has torch and torch_npu from the
        # wheelhouse by the example's pins.
        assert on_node(server, "readlink -f /opt/venv/bin/python3").stdout.strip() == CANN_PYTHON
        found = on_node(server, f"python -c '{VERSIONS}' numpy torch torch_npu").stdout.split()
        assert found[:2] == ["1.24.0", f"{CANN_SITE}/numpy/__init__.py"], found
        assert found[2:4] == ["2.13.0+cpu", "/opt/venv/lib/python3.11/site-packages/torch/__init__.py"], found
        assert found[4:] == ["2.13.0", "/opt/venv/lib/python3.11/site-packages/torch_npu/__init__.py"], found
        assert (
            on_node(server, "ls /opt/venv/lib/python3.11/site-packages | grep -ci '^numpy' || true").stdout
            == "0\n"
        )
        # No whole-inventory rank table in every shell: each job sets its own.
        assert on_node(server, 'echo "${RANK_TABLE_FILE:-unset}"').stdout.strip() == "unset"


def test_ascend_requirements_that_would_shadow_the_base_numpy_are_refused(
    ascend_cluster: PlaybookResult, tmp_path: Path
) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("torch==2.13.0\ntorch-npu==2.13.0\nnumpy==2.4.6\nPyYAML>=6\n")
    result = run_playbook(
        "site.yml",
        {"training_image_requirements": str(requirements)},
        inventory=SIM_ASCEND,
        cmdline="--tags training_image_base",
    )
    flat = " ".join(result.stdout.split())
    assert result.rc != 0
    assert (
        f"training_image_requirements ({requirements}) line 3 asks for numpy==2.4.6, but the base image has"
        f" numpy 1.24.0 in {CANN_SITE}: remove the line or make it numpy==1.24.0" in flat
    ), flat[-3000:]
    assert "Nothing was built" in flat
