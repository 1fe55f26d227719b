"""Virtual servers seeded as a bring-up leaves them, at a size where running one would cost the controller an
hour (about 4 CPU-s per server): bench/bench_controller.py's warm and plan stages without a bring-up.

The seed is derived from a real bring-up of a few servers, the template (site.yml on TEMPLATE_SERVERS virtual
servers, with ``DDP_VIRTUAL_CONTENT=1`` so each server keeps its files' text), never written by hand:

- :func:`controller_files`: the controller's own files are the template's (its mesh key pair), and each node's
  record (``nodes/<node>.json``, which the containers stage writes: address, host keys, workspace) is the
  template record of its model server (vs0 for vs0, vs1 for the others) with the name, address and host key
  put in;
- the cluster is then compiled by the project's own action (``seed.yml --tags compile``: the peers, the hosts
  file, known_hosts from those records, each node's inputs);
- :func:`servers`: each server's state (ufw rules, the node container's specification, its files, the mesh's
  files, sysctl) is its model's, with two kinds of text replaced: what lists the cluster (the hosts file,
  known_hosts, the node names, the peers' networks, the address map, somaxconn: the template's compiled
  values by the target's, as the compile gave them) and what names the server itself (its name, address,
  host key). The firewall's rule per network of peers becomes one rule per network of the target's peers;
- the state files are then written by record.yml's action (``seed.yml``: ``ddp_cluster_probe mode: record``
  probes every server and writes its wanted and actual digests through ``ddp_cluster.inventory.drift``), as
  site.yml's last play does after a bring-up.

A template text that names another of its servers outside those lists, or two template servers that differ
beyond their name, address and host key (checked on every seed), fail the seed: it does not guess.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import server

HERE = Path(__file__).resolve().parent
PLAYBOOK = HERE / "seed.yml"
TEMPLATE_SERVERS = 4
CLUSTER = "virtual"  # group_vars/all.yml's cluster_name
# The controller's directories a seed makes itself: the compiled cache (the compile writes it), the node
# records and state files (per node), a run's locks.
PER_RUN = ("compiled", "nodes", "locks")


class SeedError(Exception):
    """The template cannot be generalised to other servers or sizes."""


def cluster_dir(folder: Path) -> Path:
    """The controller's directory of the virtual cluster (bench_controller.environment: HOME=FOLDER/home)."""
    return folder / "home" / ".ddp-cluster" / CLUSTER


def names(count: int) -> list[str]:
    """The servers of hosts.py, in its order."""
    return [f"vs{index}" for index in range(count)]


def model(host: str) -> str:
    """The template server whose state HOST takes: vs0 builds the node image (group_vars), the others are
    alike."""
    return "vs0" if host == "vs0" else "vs1"


@dataclass(frozen=True)
class Cluster:
    """What the compile gave one size: the cluster-wide values the servers' texts are made of."""

    nodes: list[str]
    addresses: dict[str, str]
    peers: list[str]
    somaxconn: int
    hosts: str
    known_hosts: str
    # slurm.conf and gres.conf: the same on every node, each a list of the cluster as a whole.
    slurm: tuple[str, ...] = ()

    @classmethod
    def read(cls, folder: Path, count: int) -> Cluster:
        compiled = cluster_dir(folder) / "compiled"
        try:
            info = json.loads((compiled / "cluster.json").read_text(encoding="utf-8"))
            hosts = (compiled / "hosts").read_text(encoding="utf-8")
            known_hosts = (compiled / "known_hosts").read_text(encoding="utf-8")
        except (OSError, ValueError) as error:
            raise SeedError(f"no compiled cluster in {compiled} ({error}): run seed.yml's compile") from None
        nodes = names(count)
        if sorted(info["addresses"]) != sorted(nodes):
            raise SeedError(f"{compiled} is not of {count} servers: it has {len(info['addresses'])}")
        return cls(
            nodes,
            {node: str(info["addresses"][node]) for node in nodes},
            [str(peer) for peer in info["peers"]],
            int(info["somaxconn"]),
            hosts,
            known_hosts,
            tuple(
                (compiled / name).read_text(encoding="utf-8")
                for name in ("slurm.conf", "gres.conf")
                if (compiled / name).is_file()
            ),
        )

    def lists(self) -> list[str]:
        """Each text that lists the cluster, as the roles write it (found anywhere in a text)."""
        found = [self.hosts, self.known_hosts, *self.slurm]
        found.append(json.dumps(self.addresses, sort_keys=True, separators=(",", ":")))
        for items in (self.nodes, self.peers, list(self.addresses.values())):
            found += [separator.join(items) for separator in (" ", ",", "\n")]
        return found


def key_blob(host: str, generation: int) -> str:
    return server.host_key(host, generation).split()[1]


class Rewrite:
    """Texts of the template's server FROM made the target's server TO: the template cluster's lists by the
    target's, FROM's name, address and host key by TO's. Any other template server named is an error."""

    def __init__(self, template: Cluster, target: Cluster, source: str, to: str, generation: int) -> None:
        if len(template.nodes) < 2:
            raise SeedError("a template of one server cannot tell the cluster's lists from the server's own")
        # Longest first: the hosts file holds the node list's words.
        self.lists = sorted(zip(template.lists(), target.lists(), strict=True), key=lambda p: -len(p[0]))
        # A value a whole text is (a sysctl setting), never a part of one (a digest, a port).
        self.wholes = {str(template.somaxconn): str(target.somaxconn)}
        self.source, self.to = source, to
        self.own = self._tokens(template, source, generation)
        self.others = {
            node: self._tokens(template, node, generation) for node in template.nodes if node != source
        }
        address = target.addresses[to]
        self.replacement = (to, address, key_blob(to, generation))

    @staticmethod
    def _tokens(cluster: Cluster, node: str, generation: int) -> tuple[re.Pattern[str], ...]:
        address = re.escape(cluster.addresses[node])
        return (
            re.compile(rf"(?<![A-Za-z0-9_]){re.escape(node)}(?![A-Za-z0-9_])"),
            re.compile(rf"(?<![0-9.]){address}(?![0-9])"),
            re.compile(re.escape(key_blob(node, generation))),
        )

    def __call__(self, text: str, where: str) -> str:
        if text in self.wholes:
            return self.wholes[text]
        marked, found = text, []
        for old, new in self.lists:
            if old and old in marked:
                marked = marked.replace(old, f"\0{len(found)}\0")
                found.append(new)
        for node, patterns in self.others.items():
            if any(pattern.search(marked) for pattern in patterns):
                raise SeedError(
                    f"{where} of template server {self.source} names {node} outside the cluster's lists: "
                    f"bench/virtual/seed.py cannot make it another server's ({text[:200]!r})"
                )
        for pattern, new in zip(self.own, self.replacement, strict=True):
            marked = pattern.sub(lambda _, new=new: new, marked)
        return re.sub("\0([0-9]+)\0", lambda match: found[int(match.group(1))], marked)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def server_state(
    state: Mapping[str, Any], rewrite: Rewrite, template: Cluster, target: Cluster
) -> dict[str, Any]:
    """The template server's STATE made the target's (files' digests only, as a server keeps them)."""
    where = f"{rewrite.source}'s"
    files: dict[str, Any] = {}
    for path, entry in state["files"].items():
        new_path = rewrite(path, f"{where} file name")
        if entry["sha256"] == "directory":
            files[new_path] = dict(entry)
            continue
        if "content" not in entry:
            raise SeedError(
                f"{where} file {path} has no text: bring the template up with {server.CONTENT_ENV}=1"
            )
        if sha(entry["content"]) != entry["sha256"]:
            raise SeedError(f"{where} file {path}: its text does not give its digest")
        text = rewrite(entry["content"], f"{where} file {path}")
        files[new_path] = {"sha256": sha(text), "mode": entry["mode"]}
    rules: list[str] = []
    peers_at = None
    peers_seen = []
    for rule in state["ufw"]:
        fields = json.loads(rule)
        if fields.get("from_ip") in template.peers:  # one rule per network of peers
            peers_at = len(rules) if peers_at is None else peers_at
            peers_seen.append(fields["from_ip"])
            continue
        rules.append(rewrite(rule, f"{where} firewall rule"))
    if peers_at is not None:
        if peers_seen != template.peers:
            raise SeedError(
                f"{where} firewall has rules for {peers_seen}, not one per network of peers {template.peers}"
            )
        fields = json.loads(state["ufw"][peers_at])
        made = [json.dumps({**fields, "from_ip": peer}, sort_keys=True) for peer in target.peers]
        rules[peers_at:peers_at] = made
    container = state["container"]
    if container is not None:
        container = {
            **container,
            "spec": rewrite(container["spec"], f"{where} container specification"),
        }
    return {
        "ufw": rules,
        "files": files,
        "container": container,
        "generation": state["generation"],
        "slurm": list(state.get("slurm") or []),
    }


def plain_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """STATE as a server keeps it without DDP_VIRTUAL_CONTENT: files' digests and modes only."""
    files = {path: {k: v for k, v in item.items() if k != "content"} for path, item in state["files"].items()}
    return {**state, "files": files}


def _record(folder: Path, node: str) -> str:
    path = cluster_dir(folder) / "nodes" / f"{node}.json"
    try:
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise SeedError(f"the template has no record of {node} ({error})") from None


def _generation(folder: Path, node: str) -> int:
    return int(server.load(node, folder)["generation"])


def _rewrites(template_dir: Path, template: Cluster, target: Cluster) -> Callable[[str], Rewrite]:
    generations = {source: _generation(template_dir, source) for source in ("vs0", "vs1")}
    cache: dict[str, Rewrite] = {}

    def rewrite(node: str) -> Rewrite:
        source = model(node)
        if node not in cache:
            cache[node] = Rewrite(template, target, source, node, generations[source])
        return cache[node]

    return rewrite


def check_template(template_dir: Path, count: int) -> None:
    """Each template server past the models is its model made it: the rule that makes vs1 into vs700 makes
    vs1 into vs2, vs3 of the template exactly (state and record), else the template cannot be generalised."""
    template = Cluster.read(template_dir, count)
    rewrite = _rewrites(template_dir, template, template)
    for node in template.nodes[2:]:
        source = model(node)
        made = server_state(server.load(source, template_dir), rewrite(node), template, template)
        have = plain_state(server.load(node, template_dir))
        if made != have:
            differ = sorted(k for k in set(made) | set(have) if made.get(k) != have.get(k))
            raise SeedError(
                f"template server {node} is not {source} with its name, address and host key put in: "
                f"{', '.join(differ)} differ (bench/virtual/seed.py must learn what else is per server)"
            )
        record = rewrite(node)(_record(template_dir, source), f"{source}'s record")
        if record != _record(template_dir, node):
            raise SeedError(f"template record of {node} is not {source}'s with its name, address, host key")


def controller_files(template_dir: Path, folder: Path, count: int) -> None:
    """The controller's files a bring-up of COUNT servers leaves, but the compiled cache and state files."""
    source_dir, target_dir = cluster_dir(template_dir), cluster_dir(folder)
    target_dir.mkdir(parents=True, exist_ok=True)
    for path in source_dir.iterdir():  # the cluster's own (its mesh key pair), the same at any size
        if path.name in PER_RUN:
            continue
        if path.is_dir():
            shutil.copytree(path, target_dir / path.name, symlinks=True)
        else:
            shutil.copy2(path, target_dir / path.name)
    template = Cluster.read(template_dir, _size(template_dir))
    records = target_dir / "nodes"
    records.mkdir(exist_ok=True)
    # The records are written before the compile, so the target's lists are not known yet: a record holds
    # none (the rewrite fails if it did), only the node's own name, address and host key.
    target = _addresses_only(count, len(template.slurm))
    rewrite = _rewrites(template_dir, template, target)
    for node in names(count):
        text = rewrite(node)(_record(template_dir, model(node)), f"{model(node)}'s record")
        if "\0" in text:
            raise SeedError(
                f"{model(node)}'s record lists the cluster: records are seeded before the compile"
            )
        (records / f"{node}.json").write_text(text, encoding="utf-8")


def _size(template_dir: Path) -> int:
    return len(list((cluster_dir(template_dir) / "nodes").glob("vs*.state.json")))


def _addresses_only(count: int, slurm_texts: int = 0) -> Cluster:
    """A target known by its addresses only (hosts.py's), before its compile: its lists are unknown, so a
    text holding one is refused by the template's check (the template's lists are replaced by a marker)."""
    nodes = names(count)
    unknown = "\0unknown\0"
    return Cluster(
        nodes,
        {node: server.address_of(index) for index, node in enumerate(nodes)},
        [unknown],
        0,
        unknown,
        unknown,
        tuple(unknown for _ in range(slurm_texts)),
    )


def servers(template_dir: Path, folder: Path, count: int) -> None:
    """Each of COUNT servers' state as a bring-up leaves it (after the target's compile)."""
    size = _size(template_dir)
    template, target = Cluster.read(template_dir, size), Cluster.read(folder, count)
    rewrite = _rewrites(template_dir, template, target)
    models = {source: server.load(source, template_dir) for source in ("vs0", "vs1")}
    for node in names(count):
        state = server_state(models[model(node)], rewrite(node), template, target)
        server.save(node, state, folder)


def not_recorded(folder: Path, count: int) -> list[str]:
    """The servers without a state file saying converged (after seed.yml's record)."""
    missing = []
    for node in names(count):
        try:
            state = json.loads((cluster_dir(folder) / "nodes" / f"{node}.state.json").read_text())
        except (OSError, ValueError):
            state = {}
        if not state.get("converged"):
            missing.append(node)
    return missing
