"""Every relative link in the documentation resolves: its file exists, its #anchor (if any) is a heading.

Container-free: reads Markdown files. Covers README.md, docs/*.md, every role's README and the other READMEs
of the tree (molecule, bench, inventories, test doubles, the package). Links with a scheme (https:, mailto:)
are not followed. Anchors are GitHub's: a heading's text, lower-cased, punctuation but `-` and `_` dropped,
spaces as `-`, a repeated heading numbered (`-1`, `-2`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    {
        REPO / "README.md",
        *REPO.glob("docs/*.md"),
        *REPO.glob("roles/*/README.md"),
        *REPO.glob("inventories/*/README.md"),
        *(REPO / name for name in ("molecule/README.md", "bench/README.md", "tests/doubles/README.md")),
        REPO / "python/README.md",
    }
)
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
# [text](target) or [text](target "title"); an image's ![alt](src) is a link too.
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(match[2])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> Iterator[str]:
    for line in prose(path.read_text(encoding="utf-8")).splitlines():
        for match in LINK.finditer(line):
            target = match[1]
            if not SCHEME.match(target):
                yield target


def broken(path: Path, root: Path = REPO) -> list[str]:
    """One line per link of PATH whose file or anchor is not there."""
    problems = []
    for target in links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        name = f"{path.relative_to(root)}: ({target})"
        if not resolved.exists():
            problems.append(f"{name}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{name}: no heading with anchor #{anchor}")
    return problems


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert path.is_file(), f"{path.relative_to(REPO)} is missing"
    problems = broken(path)
    assert problems == [], "\n".join(problems)


def test_the_checker_finds_a_missing_file_and_anchor_and_skips_code(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text(
        "# Other\n\n## The gate (check.yml)\n\n## Same\n\n## Same\n", encoding="utf-8"
    )
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](other.md#the-gate-checkyml) [second](other.md#same-1) [web](https://example.com/x)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere) `[code](nowhere.md)`\n"
        "```\n[fenced](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    assert anchors(tmp_path / "other.md") == {"other", "the-gate-checkyml", "same", "same-1"}
    assert list(links(doc)) == [
        "other.md#the-gate-checkyml",
        "other.md#same-1",
        "missing.md",
        "other.md#nowhere",
    ]
    assert broken(doc, root=tmp_path) == [
        "doc.md: (missing.md): no such file",
        "doc.md: (other.md#nowhere): no heading with anchor #nowhere",
    ]


# --- names of the tree in the prose ------------------------------------------------------------------------
PACKAGE = REPO / "python" / "src"
# ddp_cluster.job.plan.make_plan, not a file name (plugins/filter/ddp_cluster.py); a placeholder
# (ddp_cluster.X) is skipped by the check.
DOTTED = re.compile(r"(?<![\w/.-])ddp_cluster(?:\.(?!py\b)[A-Za-z_]\w*)+")
# The top-level directories a path in the prose starts with.
TOP_DIRS = (
    "roles playbooks python plugins scripts tests docker inventories bench molecule sim requirements docs .ci"
)
# `roles/ddp_job/tasks/main.yml` or `roles/ddp_job/tasks/main.yml:20-32`
REPO_PATH = re.compile(rf"`((?:{'|'.join(map(re.escape, TOP_DIRS.split()))})/[^`\s:]*)(?::[0-9,-]+)?`")
PLACEHOLDERS = {"KIND", "ROLE", "NODE", "JOB", "ID", "N", "DIR", "NAME", "SUITE"}


def module_file(parts: list[str], root: Path = PACKAGE) -> tuple[Path | None, int]:
    """The file of the longest module prefix of ``parts``, and how many parts it covers."""
    for count in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:count])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate, count
    return None, 0


def defines(source: str, name: str) -> bool:
    """Whether a module's text defines or imports ``name`` (a function, class, constant or field)."""
    return bool(
        re.search(
            rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]|\bimport\b.*\b{name}\b",
            source,
            re.M,
        )
    )


def unknown_names(path: Path, root: Path = PACKAGE) -> list[str]:
    """One line per ``ddp_cluster.X.Y`` of PATH that is no module of the package, nor a name one defines (the
    first name after the module is checked: ``ddp_cluster.job.plan.Plan``, not ``Plan.to_dict``)."""
    problems = []
    for match in DOTTED.finditer(path.read_text(encoding="utf-8")):
        parts = match[0].split(".")
        if any(part.isupper() for part in parts):
            continue  # a placeholder: ddp_cluster.X
        found, count = module_file(parts, root)
        exported = (
            found is not None and count == 1 and len(parts) > 1 and defines(found.read_text(), parts[1])
        )
        if found is None or (count < 2 and not exported):  # ddp_cluster.heartbeat: the package exports it
            problems.append(f"{match[0]}: no such module of the package")
        elif count < len(parts) and not defines(found.read_text(encoding="utf-8"), parts[count]):
            problems.append(f"{match[0]}: {'.'.join(parts[:count])} defines no {parts[count]}")
    return problems


def missing_paths(path: Path, root: Path = REPO) -> list[str]:
    """One line per repository path in a code span of PATH (roles/..., python/..., ...) that is not there."""
    problems = []
    for match in REPO_PATH.finditer(path.read_text(encoding="utf-8")):
        name = match[1].rstrip("/")
        if re.search(r"[<>*{}]|\.\.\.", name) or set(re.findall(r"[A-Z]+", name)) & PLACEHOLDERS:
            continue
        if not (root / name).exists():
            problems.append(f"{name}: no such file or directory")
    return problems


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_package_name_and_repository_path_exists(path: Path) -> None:
    problems = unknown_names(path) + missing_paths(path)
    assert problems == [], f"{path.relative_to(REPO)}:\n" + "\n".join(problems)


def test_the_name_checker_finds_a_moved_module_and_a_missing_path(tmp_path: Path) -> None:
    package = tmp_path / "ddp_cluster"
    (package / "job").mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "job" / "__init__.py").write_text("", encoding="utf-8")
    (package / "job" / "plan.py").write_text("def make_plan():\n    pass\nLIMIT = 3\n", encoding="utf-8")
    (tmp_path / "roles").mkdir()
    (tmp_path / "plugins" / "filter").mkdir(parents=True)
    (tmp_path / "plugins" / "filter" / "ddp_cluster.py").write_text("", encoding="utf-8")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "`ddp_cluster.job.plan.make_plan`, ddp_cluster.job.plan.LIMIT, ddp_cluster.job, ddp_cluster.X,\n"
        "`plugins/filter/ddp_cluster.py`, `ddp_cluster.jobs`, ddp_cluster.job.plan.gone,\n"
        "`roles/`, `roles/KIND_host/`, `roles/gone/tasks/main.yml:3`\n",
        encoding="utf-8",
    )
    assert unknown_names(doc, root=tmp_path) == [
        "ddp_cluster.jobs: no such module of the package",
        "ddp_cluster.job.plan.gone: ddp_cluster.job.plan defines no gone",
    ]
    assert missing_paths(doc, root=tmp_path) == ["roles/gone/tasks/main.yml: no such file or directory"]


# --- the README's cheat sheet ------------------------------------------------------------------------------
def cheat_sheet() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return text[text.index("## Cheat sheet") : text.index("## Documentation")]


def test_the_cheat_sheet_lists_every_playbook_make_target_and_subcommand() -> None:
    sheet = cheat_sheet()
    playbooks = [path.name for path in sorted(REPO.glob("*.yml"))]
    # make help's lines: "make TARGET   what it does" (a line may name two: "make sim-up ... sim-down ...")
    help_lines = re.findall(r'^\t@echo "make ([\w-]+)', (REPO / "Makefile").read_text(encoding="utf-8"), re.M)
    cli = (REPO / "python/src/ddp_cluster/cli.py").read_text(encoding="utf-8")
    subcommands = re.findall(r'^    "([\w-]+)": \(', cli, re.M)
    short = (REPO / "python/src/ddp_cluster/job/commands.py").read_text(encoding="utf-8")
    listed = short[short.index("JOB_COMMANDS = {") : short.index("\n}\n")]
    subcommands += re.findall(r'^    "([\w-]+)": ', listed, re.M)
    assert playbooks and help_lines and subcommands
    missing = [f"playbook {name}" for name in playbooks if f"`{name}`" not in sheet]
    missing += [f"make {target}" for target in help_lines if f"`make {target}`" not in sheet]
    missing += [f"ddp-cluster {name}" for name in subcommands if f"ddp-cluster {name} " not in sheet]
    assert missing == [], "README.md's cheat sheet lacks: " + ", ".join(missing)


def test_the_readme_stays_short() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"README.md has {lines} lines: the details belong in docs/"


# --- the settings the docs name exist -----------------------------------------------------------------------
# A role's or the cluster's setting named in the docs (`training_image_build_address`), and an extra var given
# with -e (`-e max_restarts=1`), is one the code declares (argument_specs, the job's user names) or reads.
SETTING = re.compile(
    r"`((?:training_image|node_container|cluster|ddp_job|slurm|ssh_mesh|npu|hccn_network|gpu_host|npu_host"
    r"|cluster_host|cluster_preflight)_[a-z0-9_]*[a-z0-9])(?![\w.])"
)
EXTRA_VAR = re.compile(r"-e\s+['\"]?\{?\"?([a-z_][a-z0-9_]*)\"?\s*[=:]")
# named in the docs on purpose though no code has them: placeholders, and what is designed but not built
NOT_CODE = {
    "cluster_x": "the placeholder of docs/add-a-setting.md",
    "name": "the placeholder of docs/add-a-setting.md (-e name=...)",
    "slurm_managed": "designed, not built: a site's own Slurm (docs/scheduling.md)",
    "slurm_conf_server": "designed, not built: a site's own Slurm (docs/scheduling.md)",
}


def code_names(root: Path = REPO) -> set[str]:
    """Every setting the roles declare, the job's user names, and every word of the playbooks, roles, plugins
    and the package (a variable read there)."""
    import yaml

    from ddp_cluster.job.request import USER_NAMES

    names = set(USER_NAMES) | set(USER_NAMES.values())
    for spec in root.glob("roles/*/meta/argument_specs.yml"):
        for entry in yaml.safe_load(spec.read_text(encoding="utf-8"))["argument_specs"].values():
            names |= set(entry.get("options") or {})
    patterns = ("*.yml", "playbooks/**/*.yml", "roles/**/*.yml", "roles/**/*.py", "roles/**/*.j2")
    patterns += ("plugins/**/*.py", "python/src/**/*.py", "inventories/**/*.yml", "docker/*", "Makefile")
    patterns += ("tests/doubles/*", "molecule/**/*.yml")
    names |= {path.name for path in root.glob("molecule/*") if path.is_dir()}  # the scenarios
    for pattern in patterns:
        for path in root.glob(pattern):
            if path.is_file():
                text = path.read_text(encoding="utf-8", errors="replace")
                names |= set(re.findall(r"[a-z][a-z0-9_]+", text))
    return names


def unknown_settings(path: Path, known: set[str]) -> list[str]:
    text = path.read_text(encoding="utf-8")
    named = set(SETTING.findall(text)) | set(EXTRA_VAR.findall(text))
    return sorted(name for name in named if name not in known and name not in NOT_CODE)


def test_every_setting_and_extra_var_the_docs_name_exists_in_the_code() -> None:
    known = code_names()
    missing = {str(path.relative_to(REPO)): unknown_settings(path, known) for path in DOCUMENTS}
    assert {doc: names for doc, names in missing.items() if names} == {}


def test_the_setting_checker_finds_a_name_no_code_has(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("Set `cluster_image_build_address`, or `-e max_restart=1`; `npu_probe.py` is a file.\n")
    found = unknown_settings(doc, {"max_restarts", "npu_probe"})
    assert found == ["cluster_image_build_address", "max_restart"]


# A doctor verdict the docs name (`hccl-EI0006`, `gloo-connection`) is one of the doctor's rules; the other
# names of that shape are tools and the supervisor's own causes.
VERDICT = re.compile(
    r"`((?:hccl|nccl|gloo|store|cuda|npu|mpi|ssh|import|killed|node|rank|job|dataloader|rdzv|device|address"
    r"|orte)-[A-Za-z0-9-]+)`"
)
NOT_VERDICTS = {"npu-smi", "ssh-copy-id", "ssh-keyscan", "device-fault"}


def test_every_doctor_verdict_the_docs_name_is_a_rule() -> None:
    import json

    rules = json.loads((PACKAGE / "ddp_cluster/job/doctor_rules.json").read_text(encoding="utf-8"))["rules"]
    ids = {rule["id"] for rule in rules} | NOT_VERDICTS
    named = {
        str(path.relative_to(REPO)): sorted(set(VERDICT.findall(path.read_text(encoding="utf-8"))) - ids)
        for path in DOCUMENTS
    }
    assert {doc: names for doc, names in named.items() if names} == {}
    assert VERDICT.findall("follows `hccl-timeout`") == ["hccl-timeout"]  # the shape of the old false claim
