"""Two tiers of a server build's image distribution (ddp_cluster.image.distribute): which servers pull from
the build server, which through a tier-1 server's pull-through cache, and where a server goes when its tier-1
server cannot serve; then the whole call through ssh doubles of the build server, the tier-1 servers and the
others."""

from __future__ import annotations

import contextlib
import functools
import math
import shlex
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddp_cluster.image import distribute as dist

DIGEST = "sha256:6087a7c117ca9ea0ac4b4e3b45534ac95779d8b0ca533dfdff6a1cc1e293bcc4"
BUILT_ID = "sha256:2ada85227f55b01da1014b2f82fb37d388f0511e20173b6555aa40f2b19e371e"


@pytest.mark.parametrize("count", [2, 3, 65, 100, 500, 1151])
def test_two_tiers_are_ceil_sqrt_groups_of_neighbours_each_led_by_its_first(count: int) -> None:
    names = [f"n{index:04d}" for index in range(count)]
    plan = dist.plan_tiers(names, "2")
    assert len(plan) == math.ceil(math.sqrt(count))
    # Every server once, in the inventory's order: each group is a run of neighbours led by its first.
    assert [name for first, group in plan.items() for name in [first, *group]] == names
    sizes = [1 + len(group) for group in plan.values()]
    assert max(sizes) - min(sizes) <= 1 and max(sizes) <= math.ceil(count / len(plan))


def test_auto_takes_two_tiers_above_64_servers_lacking_the_image() -> None:
    names = [f"n{index}" for index in range(65)]
    assert dist.plan_tiers(names[:64], "auto") == {}
    assert len(dist.plan_tiers(names, "auto")) == 9
    assert dist.plan_tiers(names, "1") == {}
    assert dist.plan_tiers(names[:1], "2") == {}
    assert dist.tier_count(1151, "auto") == 2 and dist.tier_count(64, "auto") == 1
    with pytest.raises(
        dist.DistributionError, match="training_image_pull_tiers is '3': set it to auto, 1 or 2"
    ):
        dist.plan_tiers(names, "3")


def result(ok: bool, rc: int = 0, error: str = "") -> dict[str, Any]:
    return {"ok": ok, "rc": rc, "error": error}


def test_a_tier1_that_cannot_serve_sends_its_group_to_the_source_as_does_a_failed_pull_through_one() -> None:
    servers = [{"name": name} for name in ["t-a", "c-a1", "c-flaky", "c-wrong", "t-down", "c-d1", "c-d2"]]
    plan = {"t-a": ["c-a1", "c-flaky", "c-wrong"], "t-down": ["c-d1", "c-d2"]}
    calls: list[tuple[str, str]] = []
    lock = threading.Lock()
    closed: list[str] = []

    def from_source(server: dict[str, Any]) -> dict[str, Any]:
        with lock:
            calls.append(("source", server["name"]))
        return dict(result(True), via="src")

    def through_a(server: dict[str, Any]) -> dict[str, Any]:
        with lock:
            calls.append(("t-a", server["name"]))
            # Each pull through t-a runs while t-a's session is open.
            assert "t-a" not in closed
        if server["name"] == "c-flaky":
            return result(False, 4, "the tunnel to t-a did not come up")
        if server["name"] == "c-wrong":
            return result(False, dist.WRONG_IMAGE, "another image")
        return dict(result(True), via="t-a")

    @contextlib.contextmanager
    def open_tier(server: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dist.Puller | None]]:
        try:
            if server["name"] == "t-down":
                yield result(False, error="the tier-1 server t-down cannot serve: no registry"), None
            else:
                yield dict(result(True), via="src"), through_a
        finally:
            with lock:
                closed.append(server["name"])

    report = dist.pull_in_tiers(servers, plan, 4, from_source, open_tier)
    assert list(report["servers"]) == [server["name"] for server in servers]
    assert report["failed_servers"] == ["c-wrong"]
    # t-down and its group pulled from the source; so did c-flaky, after its pull through t-a failed; c-wrong
    # (another image) was not tried anywhere else.
    assert sorted(name for where, name in calls if where == "source") == ["c-d1", "c-d2", "c-flaky", "t-down"]
    assert sorted(name for where, name in calls if where == "t-a") == ["c-a1", "c-flaky", "c-wrong"]
    assert report["tiers"] == {
        "t-a": {"ok": True, "error": "", "served": ["c-a1"]},
        "t-down": {"ok": False, "error": "the tier-1 server t-down cannot serve: no registry", "served": []},
    }
    assert sorted(closed) == ["t-a", "t-down"]


# The build server's session (as files/registry-source.sh says), the tier-1 servers' sessions (its proxy mode:
# tier-down's cannot start its cache) and every receiver's pull, each logged with its argv into $DDP_FAKE_LOG.
SSH = r"""#!/bin/sh
prev=
for arg; do target=$prev; prev=$arg; done
printf '%s %s\n' "$target" "$prev" >> "$DDP_FAKE_LOG"
case "$prev" in
  *ddp-registry\ proxy*)
    IFS= read -r password
    while IFS= read -r line; do case $line in "-----END "*) break ;; esac; done
    echo "tunnel: up"
    [ "$target" = tier-down ] && {
      echo "error: the image registry did not start on the tier-1 server"
      exit 3
    }
    echo "0123456789ab: Pull complete"
    echo "pulled: 127.0.0.1:15001/ddp-cluster/node@$DDP_FAKE_DIGEST"
    echo "image_id: sha256:2ada85227f55b01da1014b2f82fb37d388f0511e20173b6555aa40f2b19e371e"
    echo "hostkey: ssh-ed25519 AAAA$target"; echo ready
    cat >/dev/null; echo "served: 100" ;;
  *ddp-registry*)
    IFS= read -r password
    echo "pushed: 2"
    echo "digest: sha256:6087a7c117ca9ea0ac4b4e3b45534ac95779d8b0ca533dfdff6a1cc1e293bcc4"
    echo "image_id: sha256:2ada85227f55b01da1014b2f82fb37d388f0511e20173b6555aa40f2b19e371e"
    echo "hostkey: ssh-ed25519 AAAAsource"; echo ready
    cat >/dev/null; echo "served: 7" ;;
  *ddp-pull*)
    cat >/dev/null
    echo "tunnel: up"
    echo "0123456789ab: Pull complete"
    echo "pulled: x" ;;
esac
"""


def test_a_server_build_in_two_tiers_pulls_through_the_tier1_caches_and_around_one_that_cannot_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ssh = tmp_path / "ssh"
    ssh.write_text(SSH)
    ssh.chmod(0o755)
    log = tmp_path / "ssh.log"
    monkeypatch.setenv("DDP_FAKE_LOG", str(log))
    monkeypatch.setenv("DDP_FAKE_DIGEST", DIGEST)
    monkeypatch.setattr(dist, "RETRY_DELAYS", (0.0, 0.0, 0.0))
    names = ["tier-a", "a1", "a2", "tier-down", "d1", "d2", "tier-c", "c1", "c2"]
    servers = [{"name": name, "ssh": [str(ssh), "-p", "2200", "-l", "ops", name]} for name in names]
    given = {
        "image": "ddp-cluster/node:ab12", "servers": servers, "registry": "", "port": 15000,
        "registry_command": "docker-registry", "storage": "/var/lib/ddp-cluster/image/registry",
        "parallel": 4, "timeout": 60, "source": {"name": "src", "ssh": [str(ssh), "src"]},
        "source_address": "10.0.0.9", "source_script": "registry", "receiver_script": "pull", "tiers": "2",
        "cache_storage": "/var/lib/ddp-cluster/image/registry-cache",
    }  # fmt: skip
    failed, report = dist.run(given, check_mode=False)
    assert not failed and report["failed_servers"] == [], report
    assert {name: report["servers"][name]["via"] for name in names} == {
        "tier-a": "src", "a1": "tier-a", "a2": "tier-a",
        "tier-down": "src", "d1": "src", "d2": "src",
        "tier-c": "src", "c1": "tier-c", "c2": "tier-c",
    }  # fmt: skip
    assert report["tiers"]["tier-down"]["error"] == (
        "the tier-1 server tier-down cannot serve: the image registry did not start on the tier-1 server"
    )
    # The source served the tier-1 caches (7 in its log), the two caches that started their groups (100 each).
    assert (report["bytes_served"], report["tier1_bytes_served"]) == (7, 200)
    calls = {
        target: shlex.split(command)
        for target, command in (line.split(" ", 1) for line in log.read_text().splitlines())
    }
    # A tier-1 server's cache listens on the port after the run's, takes the source through its own tunnel
    # and pulls the image through itself.
    proxy = calls["tier-a"]
    assert proxy[3:7] == ["ddp-registry", "proxy", "15001", "/var/lib/ddp-cluster/image/registry-cache"]
    assert proxy[7:9] == [f"127.0.0.1:15001/ddp-cluster/node@{DIGEST}", "ddp-cluster/node:ab12"]
    assert proxy[-5:] == ["15000", "10.0.0.9", "22", "", "ssh-ed25519 AAAAsource"]
    # Its group tunnels to its sshd (address, port, user from its ssh), its host key pinned, to the cache's
    # port; the group of the one that could not serve tunnels to the source.
    pulled = [f"127.0.0.1:15000/ddp-cluster/node@{DIGEST}", "ddp-cluster/node:ab12", BUILT_ID]
    assert calls["a1"][4:] == [*pulled, "15000", "tier-a", "2200", "ops", "ssh-ed25519 AAAAtier-a", "15001"]
    assert calls["d1"][4:] == [*pulled, "15000", "10.0.0.9", "22", "", "ssh-ed25519 AAAAsource"]


def test_the_controllers_registry_reaches_its_tier1_caches_through_their_sessions_own_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ssh = tmp_path / "ssh"
    ssh.write_text(SSH)
    ssh.chmod(0o755)
    log = tmp_path / "ssh.log"
    monkeypatch.setenv("DDP_FAKE_LOG", str(log))
    monkeypatch.setenv("DDP_FAKE_DIGEST", DIGEST)
    params = {
        "image": "ddp-cluster/node:ab12", "port": 15000, "timeout": 60, "registry_command": "docker-registry",
        "source_script": "registry", "receiver_script": "pull", "cache_storage": "/var/tmp/cache",
    }  # fmt: skip
    pulled = f"127.0.0.1:15000/ddp-cluster/node@{DIGEST}"
    receiver = functools.partial(dist.tunnelled_puller, params, pulled, BUILT_ID, "AUTH\nKEY")
    cache = dist.TierCache(params, pulled, BUILT_ID, ("15000",), "PASSWORD\n-----END KEY-----\n",
                           "ssh-ed25519 K", "ddp-cluster-image-1", None, receiver, "controller",
                           forward=15000)  # fmt: skip
    tier = {"name": "tier-a", "ssh": [str(ssh), "tier-a"]}
    argv = cache.argv(tier)
    # The session itself carries the controller's registry to the tier-1 server's loopback (no tunnel of its
    # own).
    assert argv[argv.index("-R") + 1] == "127.0.0.1:15000:127.0.0.1:15000"
    assert shlex.split(argv[-1])[-1] == "15000"
    with cache.open(tier) as (own, through):
        assert own["ok"] and own["via"] == "controller" and through is not None
        child = through({"name": "a1", "ssh": [str(ssh), "a1"]})
    assert child["ok"] and child["via"] == "tier-a" and cache.bytes_served == 100
    said = shlex.split(log.read_text().splitlines()[-1].split(" ", 1)[1])
    assert said[4:] == [pulled, "ddp-cluster/node:ab12", BUILT_ID, "15000", "tier-a", "22", "",
                        "ssh-ed25519 AAAAtier-a", "15001"]  # fmt: skip
