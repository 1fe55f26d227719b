"""What the gpu_host role told each NVIDIA host double: nothing on the one with a GPU per process; the
server's name, the GPUs listed and the GPUs needed on the one with fewer."""

import os

import testinfra.utils.ansible_runner

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")

FAILURE = "/var/lib/ddp-doubles/gpu_host-failure"


def test_a_host_with_a_gpu_per_process_passes_and_a_short_one_is_named(host):
    name = host.backend.get_hostname()
    failure = host.file(FAILURE)
    if name == "gpu-ok":
        assert not failure.exists
    else:
        said = " ".join(failure.content_string.split())
        assert "gpu-short: `nvidia-smi -L` lists 1 GPU(s) (rc 0), 2 needed (gpu_host_min_gpus" in said
        assert "Install the NVIDIA driver and the NVIDIA Container Toolkit" in said


def test_the_double_lists_the_gpus_the_role_counted(host):
    listed = host.check_output("nvidia-smi -L").splitlines()
    assert len([line for line in listed if line.startswith("GPU ")]) == (
        2 if host.backend.get_hostname() == "gpu-ok" else 1
    )
