"""Where the node image is built (cluster_image_builder), from the engines' own answers."""

from __future__ import annotations

import pytest

from ddp_cluster.image.builder import BuilderError, arch, choose, choose_for_role

X86 = "28.5.1 amd64"
ARM = "26.1.5 arm64"


def test_auto_builds_on_a_server_when_the_servers_are_another_architecture() -> None:
    choice = choose("auto", X86, "", {"atlas0": ARM, "atlas1": ARM})
    assert (choice.builder, choice.host) == ("server", "atlas0")
    assert "the servers are arm64 and this controller is amd64" in choice.reason


def test_auto_builds_on_a_server_when_the_controller_has_no_engine() -> None:
    choice = choose("auto", None, "Cannot connect to the Docker daemon", {"gpu0": X86, "gpu1": X86})
    assert (choice.builder, choice.host) == ("server", "gpu0")
    assert "no Docker engine (Cannot connect to the Docker daemon)" in choice.reason


def test_auto_builds_on_the_controller_of_the_servers_architecture() -> None:
    choice = choose("auto", X86, "", {"gpu0": X86, "gpu1": X86})
    assert (choice.builder, choice.host) == ("controller", "localhost")
    assert "amd64, as the servers are" in choice.reason


def test_auto_on_the_local_inventory_is_the_controller_and_needs_its_engine() -> None:
    assert choose("auto", X86, "", {}, local_hosts=["node0", "node1"]).builder == "controller"
    with pytest.raises(BuilderError, match="start it"):
        choose("auto", None, "no such file", {}, local_hosts=["node0"])


def test_the_build_host_is_named_or_the_first_server() -> None:
    servers = {"b": ARM, "a": ARM}
    assert choose("server", X86, "", servers).host == "a"
    assert choose("server", X86, "", servers, build_host="b").host == "b"
    with pytest.raises(BuilderError, match=r"cluster_image_build_host is 'c'.*name one of a, b"):
        choose("server", X86, "", servers, build_host="c")


def test_server_refuses_local_hosts_and_mixed_architectures() -> None:
    with pytest.raises(BuilderError, match="node0 run on this controller's own engine"):
        choose("server", X86, "", {}, local_hosts=["node0"])
    with pytest.raises(BuilderError, match="the build server a is arm64 but b is amd64"):
        choose("server", None, "", {"a": ARM, "b": X86})
    with pytest.raises(BuilderError, match="every server must share one architecture"):
        choose("auto", X86, "", {"a": ARM, "b": X86})


def test_controller_refuses_another_architecture_and_a_missing_engine() -> None:
    with pytest.raises(
        BuilderError, match=r"controller is amd64, but atlas0 is arm64.*cluster_image_builder: server"
    ):
        choose("controller", X86, "", {"atlas0": ARM})
    with pytest.raises(BuilderError, match="the base image is arm64, but gpu0 is amd64"):
        choose("controller", X86, "", {"gpu0": X86}, image_arch="arm64")
    with pytest.raises(BuilderError, match="no Docker engine answers on this controller \\(refused\\)"):
        choose("controller", None, "refused", {"gpu0": X86})
    assert choose("controller", X86, "", {"gpu0": X86}).builder == "controller"


def test_a_misspelt_setting_is_named() -> None:
    with pytest.raises(BuilderError, match="cluster_image_builder is 'servers': set auto"):
        choose("servers", X86, "", {"a": X86})


def test_architecture_names() -> None:
    assert [arch(word) for word in ("x86_64", "aarch64", "28.0 amd64", "arm64", "")] == [
        "amd64", "arm64", "amd64", "arm64", ""
    ]  # fmt: skip


def test_the_roles_registered_answers_are_read_as_the_engines_answers() -> None:
    servers = {"atlas0": ARM, "atlas1": ARM}
    missing = {"rc": 2, "msg": "[Errno 2] No such file or directory: b'docker'", "failed": True}
    chosen = choose_for_role("auto", missing, servers, [], "atlas1")
    assert (chosen["builder"], chosen["host"], chosen["error"]) == ("server", "atlas1", "")
    assert "no Docker engine ([Errno 2] No such file or directory: b'docker')" in chosen["reason"]
    assert "(no answer)" in choose_for_role("controller", None, servers)["error"]
    down = {"rc": 1, "stdout": "", "stderr": "Cannot connect\n to the Docker daemon"}
    refused = choose_for_role("controller", down, servers)
    assert refused["builder"] == "" and "(Cannot connect to the Docker daemon)" in refused["error"]
    assert choose_for_role("auto", {"rc": 0, "stdout": ARM + "\n"}, servers)["builder"] == "controller"
