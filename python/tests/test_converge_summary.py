"""site.yml's last line when servers did not converge (ddp_cluster.inventory.summary): Ansible's events in,
the line out; failures Ansible does not count (ignored, rescued) left out, unreachable servers said apart."""

from __future__ import annotations

from ddp_cluster.inventory import summary
from ddp_cluster.inventory.summary import ConvergeSummary

NODES = [f"sim-server{index}" for index in range(4)]


def run(playbook: str = "site.yml", stage: str = "hosts", percentage: float | None = 10.0) -> ConvergeSummary:
    made = ConvergeSummary(summary.converges(playbook))
    made.play(stage, NODES, percentage, fatal=False)
    return made


def test_only_site_yml_and_its_stages_get_the_line() -> None:
    assert summary.converges("site.yml") == "site.yml"
    assert summary.converges("/work/main/site.yml") == "site.yml"
    assert summary.converges("playbooks/containers.yml") == "playbooks/containers.yml"
    assert summary.converges("/x/playbooks/mesh.yml") == "playbooks/mesh.yml"
    for other in ("train.yml", "jobs.yml", "check.yml", "playbooks/teardown.yml", "mesh.yml", ""):
        assert summary.converges(other) == "", other


def test_the_stage_is_the_plays_playbook_under_playbooks_else_its_name() -> None:
    assert summary.stage_of("/repo/playbooks/containers.yml:2", "Start one node container per node") == (
        "containers"
    )
    assert summary.stage_of("/repo/playbooks/hosts.yml", "x") == "hosts"
    assert summary.stage_of("/repo/site.yml:3", "A play in site.yml") == "A play in site.yml"
    assert summary.stage_of("", "") == "?"


def test_a_clean_run_says_nothing() -> None:
    made = run()
    assert made.line({}, {}, {}) == ""


def test_a_failed_and_an_unreachable_server_are_named_with_stage_task_and_message() -> None:
    made = run()
    made.failed("sim-server2", "Install the engine", {"msg": "No package docker-ce available."})
    made.play("containers", NODES, 10.0, fatal=False)
    made.failed(
        "sim-server1",
        "Start the node container",
        {"msg": "Task failed: Failed to connect to the host via ssh: refused", "unreachable": True},
        unreachable=True,
    )
    line = made.line({"sim-server2": 1}, {"sim-server1": 1}, {})
    assert line == (
        "site.yml: 2 of 4 servers converged; not: sim-server2 (hosts: Install the engine: No package"
        " docker-ce available.), sim-server1 (unreachable in containers: Failed to connect to the host"
        " via ssh: refused); run site.yml again for them"
    )


def test_only_the_first_failure_of_a_server_is_named() -> None:
    made = run()
    made.failed("sim-server3", "first", {"msg": "the first"})
    made.failed("sim-server3", "second", {"msg": "the second"})
    line = made.line({"sim-server3": 2}, {}, {})
    assert "the first" in line and "the second" not in line and "3 of 4" in line


def test_rescued_failures_do_not_count_and_do_not_hide_the_real_one() -> None:
    made = run()
    made.failed("sim-server0", "a try", {"msg": "rescued"})  # rescued: the recap counts no failure
    made.failed("sim-server1", "a try", {"msg": "rescued too"})
    made.failed("sim-server1", "the real one", {"msg": "broke"})
    line = made.line({"sim-server1": 1}, {}, {"sim-server0": 1, "sim-server1": 1})
    assert "sim-server0" not in line
    assert "sim-server1 (hosts: the real one: broke)" in line and "rescued" not in line
    assert made.line({}, {}, {"sim-server0": 1, "sim-server1": 1}) == ""


def test_an_ignored_unreachable_is_not_the_failure_named() -> None:
    made = run()
    made.failed("sim-server2", "probe", {"msg": "gone"}, unreachable=True)  # ignore_unreachable: no dark
    made.failed("sim-server2", "use it", {"msg": "broke"})
    assert "sim-server2 (hosts: use it: broke)" in made.line({"sim-server2": 1}, {}, {})


def test_messages_are_one_line_of_at_most_300_characters() -> None:
    made = run()
    made.failed("sim-server0", "t", {"msg": "word\n" * 200})
    described = made.line({"sim-server0": 1}, {}, {})
    message = described.split("(hosts: t: ")[1].split("); run")[0]
    assert len(message) == summary.MESSAGE_CHARS and message.endswith("...") and "\n" not in message


def test_a_commands_failure_says_its_status_and_last_output_lines() -> None:
    result = {"msg": "non-zero return code", "rc": 2, "stderr": "a\nb\nc\nno space left on device"}
    assert summary.message_of(result) == "non-zero return code: rc 2 b / c / no space left on device"
    assert summary.message_of({"rc": 1, "stdout": "only out"}) == "rc 1 only out"
    assert summary.message_of({}) == "failed (no message)"


def test_a_loops_failure_names_its_first_failed_item() -> None:
    result = {
        "msg": "One or more items failed",
        "results": [
            {"item": "a", "skipped": True},
            {"item": "b", "failed": False},
            {"item": "c", "failed": True, "msg": "port 12345 is taken"},
            {"item": "d", "failed": True, "msg": "later"},
        ],
    }
    assert summary.message_of(result) == "item c: port 12345 is taken"


def test_a_stage_run_alone_names_itself() -> None:
    made = run("playbooks/containers.yml", "containers")
    made.failed("sim-server0", "t", {"msg": "m"})
    assert made.line({"sim-server0": 1}, {}).startswith("playbooks/containers.yml: 3 of 4 servers converged;")
    assert made.line({"sim-server0": 1}, {}).endswith("run playbooks/containers.yml again for them")


def test_a_run_stopped_by_max_fail_percentage_converged_none_and_says_why() -> None:
    made = run(stage="image", percentage=10.0)
    made.failed("sim-server3", "Pull the image", {"msg": "manifest unknown"})
    made.no_hosts_remaining()
    made.no_hosts_remaining()  # Ansible says it again at the end: the first stage is the one that stopped
    assert made.line({"sim-server3": 1}, {}, {}) == (
        "site.yml: 0 of 4 servers converged (the run stopped in image: more than 10% of its servers failed"
        " (max_fail_percentage; -e max_fail_percent=N allows more)); failed: sim-server3 (image: Pull the"
        " image: manifest unknown); 3 others stopped with them; fix the failures and run site.yml again"
    )


def test_a_run_stopped_in_preflight_says_one_failure_stops_every_server() -> None:
    made = ConvergeSummary("site.yml")
    made.play("preflight", NODES[:2], None, fatal=True)
    made.failed("sim-server1", "Log in", {"msg": "cannot log in over ssh"})
    made.no_hosts_remaining()
    line = made.line({"sim-server1": 1}, {}, {})
    assert line.startswith(
        "site.yml: 0 of 2 servers converged (the run stopped in preflight: one failure there stops every"
        " server); failed: sim-server1 (preflight: Log in: cannot log in over ssh); 1 other stopped with them"
    )


def test_many_failures_name_the_first_fifty_and_count_the_rest() -> None:
    made = ConvergeSummary("site.yml")
    nodes = [f"n{index}" for index in range(1152)]
    made.play("hosts", nodes, 10.0, fatal=False)
    for node in nodes[:60]:
        made.failed(node, "t", {"msg": "m"})
    line = made.line(dict.fromkeys(nodes[:60], 1), {}, {})
    assert line.startswith("site.yml: 1092 of 1152 servers converged; not: n0 (hosts: t: m),")
    assert "n49 (hosts" in line and "n50 (" not in line and "and 10 more" in line


def test_the_servers_counted_are_every_plays_nodes_a_controller_play_is_named_not_counted() -> None:
    made = ConvergeSummary("site.yml")
    made.play("preflight", [], None, fatal=True)  # a controller play: no node
    made.play("hosts", ["a", "b"], 10.0, fatal=False)
    made.play("mesh", ["b", "c"], 10.0, fatal=False)
    made.failed("localhost", "t", {"msg": "m"})
    made.failed("b", "t", {"msg": "m"})
    assert made.line({"localhost": 1, "b": 1}, {}).startswith(
        "site.yml: 2 of 3 servers converged; not: localhost (mesh: t: m), b (mesh: t: m)"
    )
    nodeless = ConvergeSummary("site.yml")
    nodeless.play("hosts", [], 10.0, fatal=False)
    nodeless.failed("x", "t", {"msg": "m"})
    assert nodeless.line({"x": 1}, {}).startswith("site.yml: 0 of 1 servers converged; not: x")


def test_a_run_that_started_fewer_plays_than_its_playbook_has_stopped_there() -> None:
    made = ConvergeSummary("site.yml", plays=5)
    made.play("compile", NODES, None, fatal=False, hosts=NODES, key="p1")
    made.failed("sim-server0", "Compile", {"msg": "broken"})  # run_once: every server failed, no callback
    assert made.line({"sim-server0": 1}, {}).startswith(
        "site.yml: 0 of 4 servers converged (the run stopped in compile); failed: sim-server0 (compile:"
        " Compile: broken); 3 others stopped with them"
    )


def test_a_stop_among_some_servers_leaves_the_others_converged_and_a_play_in_batches_counts_once() -> None:
    made = ConvergeSummary("site.yml", plays=2)
    made.play("compile", NODES, None, fatal=False, hosts=NODES, key="p1")
    made.play("image", NODES, 10.0, fatal=False, hosts=NODES[:2], key="p2")
    made.play("image", NODES, 10.0, fatal=False, hosts=NODES[2:3], key="p2")  # serial: a second batch
    made.failed("sim-server2", "Pull", {"msg": "manifest unknown"})
    assert made.line({"sim-server2": 1}, {}) == (
        "site.yml: 3 of 4 servers converged; not: sim-server2 (image: Pull: manifest unknown); run site.yml"
        " again for them"
    )
    made.no_hosts_remaining()
    assert made.line({"sim-server2": 1}, {}).startswith(
        "site.yml: 3 of 4 servers converged (the run stopped in image: more than 10% of its servers failed"
    )
