"""What the node image owns of the files a shell or Python runs at its start, checked and put back before each
job, so that nothing a job leaves there runs in the next one (and reads its secrets).

Node containers outlive their jobs, and a job runs as root in its container: it can leave a
``sitecustomize.py`` or a ``.pth`` file in site-packages, edit ``/etc/ddp-cluster/env.sh`` or a shell's rc
file, add an ssh ``rc`` or an ``authorized_keys``. Each of those runs code in every later job's shells and
Pythons. The image records, at its build (:func:`record`, the Dockerfile's last steps), a manifest of those
places (:data:`MANIFEST`: each entry's kind, mode and SHA-256) with a copy of each file (:data:`COPIES`);
before a job starts on a node (the start check from the first node, and the supervisor before a restart's
launch), :func:`reset` compares every place with the manifest: a file that differs or is missing is put back
from the copy, an entry the image did not have there is removed, and what was undone is said, one line each.
What cannot be put back (a directory of the image replaced, a copy that no longer matches the manifest) is a
refusal that names the path and the fix: recreate the node.

The places (:func:`default_places`, found with the image's own Python at the build):

- ``file``: one path, the image's version or its absence (``/etc/profile``, ``/etc/bash.bashrc``,
  ``/root/.bashrc``, ``/etc/ld.so.preload``, sshd's and ssh's configuration, ...);
- ``tree``: a directory and everything under it (``/etc/profile.d``, ``/etc/ddp-cluster``, ``/root/.ssh``,
  ``/opt/venv/bin``, the ``ddp_cluster`` package's source, each site directory's ``__pycache__``, the
  standard library's ``encodings``);
- ``top``: a directory's own entries: its files whole, its directories by name only (each site directory of
  the image's Python, the user's site directory, the standard library): a package a job adds or a
  ``sitecustomize`` it plants is removed, a change inside a package the image has (``torch/``) is not seen.

Files the node writes itself are the node's, not the image's (:data:`NODE_OWNED`: the host keys and sshd's
port, which the entrypoint writes at the container's start; the mesh's key, authorized key, pinned host keys
and ssh settings, which ``site.yml`` writes): they are kept, and two are checked: the authorized keys hold
the cluster's key only (the public half of the node's own key), and sshd's ``sshd_config.d`` file names only
the port, the address and the host keys.

The reset runs as ``python3 -I -S`` (:func:`command`): no ``.pth``, ``sitecustomize`` or ``PYTHON*`` variable
a job left runs in it. It is no defence against a job that replaces the interpreter, a library or the
manifest itself (root in the container can): docs/security.md states that boundary.

    python3 -I -S image_reset.py record [--python PYTHON] [--add PLACE...]   # at the image's build
    python3 -I -S image_reset.py reset [--check] [--unless-running JOBS_DIR]   # before each job

Standard library only, Python 3.8: it runs in the node's own Python, with no site packages.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from typing import Any, Iterator, NamedTuple, Sequence

HOME = "/usr/lib/ddp-cluster/image"
MANIFEST = HOME + "/manifest.json"
# What `record --add` writes (the package's source, the image's last layer), joined to the manifest by load.
ADDED = "added.json"
COPIES = HOME + "/files"
# Where the image keeps this file (the Dockerfile copies it there before the package's own layer).
SCRIPT = "/usr/lib/ddp-cluster/image_reset.py"
PYTHON = "/opt/venv/bin/python3"
# Each line of the reset's output starts with one of these (the start check reads them).
UNDONE = "reset: "
REFUSED = "reset refused: "
SKIPPED = "reset skipped: "

# The paths the shells and sshd read at a start, one file each: the image's version, or none.
SHELL_FILES = (
    "/etc/profile",
    "/etc/bash.bashrc",
    "/etc/bashrc",
    "/etc/environment",
    "/etc/ld.so.preload",
    "/etc/ld.so.conf",
    "/etc/ld.so.cache",
    "/etc/ssh/sshd_config",
    "/etc/ssh/ssh_config",
    "/etc/ssh/sshrc",
    "/root/.bashrc",
    "/root/.profile",
    "/root/.bash_profile",
    "/root/.bash_login",
    "/root/.bash_logout",
    "/root/.pydistutils.cfg",
    "/etc/pip.conf",
)
SHELL_TREES = (
    "/etc/profile.d",
    "/etc/ld.so.conf.d",
    "/etc/ssh/ssh_config.d",
    "/etc/ssh/sshd_config.d",
    "/etc/ddp-cluster",
    "/root/.ssh",
    "/root/.config/pip",
    "/opt/venv/bin",
)
PACKAGE = "/opt/ddp_cluster/src"
# The node's own files in those places: written at the container's start or by site.yml, never by the image.
NODE_OWNED = (
    "/etc/ssh/sshd_config.d/10-ddp-cluster.conf",
    "/etc/ddp-cluster/authorized_keys",
    "/etc/ddp-cluster/known_hosts",
    "/etc/ddp-cluster/ssh_config",
    "/etc/ddp-cluster/node",  # the node's settings, mounted read-only from its server
    "/etc/ddp-cluster/munge.key",  # the cluster's munge key (the slurm role)
    "/root/.ssh/id_ddp_cluster",
)
NODE_KEY = "/root/.ssh/id_ddp_cluster"
AUTHORIZED_KEYS = "/etc/ddp-cluster/authorized_keys"
SSHD_NODE_CONF = "/etc/ssh/sshd_config.d/10-ddp-cluster.conf"
# What the entrypoint writes into sshd_config.d: any other keyword there (sshd keeps the first value it reads,
# and this file is read first) would change how the node lets logins in.
SSHD_NODE_KEYWORDS = ("port", "listenaddress", "hostkey")
CHUNK = 1 << 20
# Directories that are never the image's start files, whatever a Python's path says: the jobs' workspace (a
# reset there would remove a job's data) and the kernel's trees. Not /tmp: a venv may live there (a clone's).
NOT_IMAGE = ("/workspace", "/dev", "/proc", "/sys")
# The fix of what a reset cannot put back: a container made anew from the image (site.yml makes one).
RECREATE = (
    "Recreate the node's container from the image: on its server `docker rm -f NODE`, then"
    " `ansible-playbook site.yml --limit NODE`"
)


class Place(NamedTuple):
    """A path of the image and how much of it the manifest holds: ``file``, ``tree`` or ``top``."""

    path: str
    scope: str


class ResetError(Exception):
    """The manifest cannot be recorded or read; the message says why."""


def digest(path: str) -> str:
    """The SHA-256 of the file at ``path`` (opened without following a link)."""
    found = hashlib.sha256()
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            found.update(chunk)
    return found.hexdigest()


def entry(path: str, with_digest: bool = True) -> dict[str, Any] | None:
    """What is at ``path``, never following a link: ``{kind: file, mode, sha256}``, ``{kind: link,
    target}``, ``{kind: dir, mode}`` or ``{kind: other}``; None when nothing is."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    mode = stat.S_IMODE(found.st_mode)
    if stat.S_ISLNK(found.st_mode):
        return {"kind": "link", "target": os.readlink(path)}
    if stat.S_ISDIR(found.st_mode):
        return {"kind": "dir", "mode": mode}
    if stat.S_ISREG(found.st_mode):
        result: dict[str, Any] = {"kind": "file", "mode": mode}
        if with_digest:
            result["sha256"] = digest(path)
        return result
    return {"kind": "other"}


def scan(root: str, place: Place) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each (image path, entry) of ``place`` under ``root``, parents before children; nothing when the place
    is missing (its absence is recorded by the caller)."""
    top = root.rstrip("/") + place.path
    found = entry(top)
    if found is None:
        return
    yield place.path, found
    if found["kind"] != "dir" or place.scope == "file":
        return
    for name in sorted(os.listdir(top)):
        path = place.path.rstrip("/") + "/" + name
        item = entry(top + "/" + name)
        if item is None:
            continue
        if item["kind"] == "dir" and place.scope == "top":
            yield path, item
        elif item["kind"] == "dir":
            yield from scan(root, Place(path, "tree"))
        else:
            yield path, item


def default_places(python: str = PYTHON) -> list[Place]:
    """The places of this image: the shells' files and trees, and what ``python``
    (with its site module on, as a job's Python runs) reads at its start: each site directory's own
    entries and ``__pycache__``, the user's site directory, the standard library's top level, its
    ``__pycache__`` and ``encodings``. The package's source (:data:`PACKAGE`), the image's last layer, is
    added after it (``record --add``)."""
    asked = (
        "import json, site, sys, sysconfig; print(json.dumps({'site': site.getsitepackages(),"
        " 'user': site.getusersitepackages(), 'stdlib': sysconfig.get_path('stdlib'),"
        " 'path': [p for p in sys.path if p]}))"
    )
    # Asked from an empty directory of its own: an empty PYTHONPATH entry (``...:$PYTHONPATH`` with none set)
    # puts the working directory on sys.path, and the build's (``/workspace``, where jobs live) is no place of
    # the image's; that directory is dropped from the answer.
    try:
        with tempfile.TemporaryDirectory(prefix="ddp-reset-") as here:
            done = subprocess.run([python, "-c", asked], capture_output=True, text=True, check=True, cwd=here)
            found = json.loads(done.stdout)
            own = os.path.realpath(here)
            found["path"] = [item for item in found["path"] if os.path.realpath(item) != own]
    except (OSError, subprocess.CalledProcessError, ValueError) as error:
        raise ResetError(f"{python} could not say where it reads its start files: {error}") from error
    places = [Place(path, "file") for path in SHELL_FILES] + [Place(path, "tree") for path in SHELL_TREES]
    stdlib = os.path.realpath(found["stdlib"])
    places += [
        Place(stdlib, "top"),
        Place(stdlib + "/__pycache__", "tree"),
        Place(stdlib + "/encodings", "tree"),
    ]
    directories = [*found["site"], found["user"], *found["path"]]
    for directory in dict.fromkeys(os.path.realpath(item) for item in directories):
        if directory == stdlib or not directory.startswith("/") or directory.endswith(".zip"):
            continue
        if never_image(directory):
            continue
        places += [Place(directory, "top"), Place(directory + "/__pycache__", "tree")]
    return places


def record(places: Sequence[Place], root: str = "/", home: str = HOME, add: bool = False) -> dict[str, Any]:
    """The manifest of ``places`` under ``root`` written to ``home`` (manifest.json, and each file copied
    under files/); with ``add``, to its own file there (:data:`ADDED`, joined to it if it exists), which
    :func:`load` joins to the manifest: the image's last layer (the package's source) holds it, and nothing
    of the layers before. Returns what was written."""
    manifest_path = os.path.join(home, ADDED if add else "manifest.json")
    manifest: dict[str, Any] = {"places": [], "entries": {}}
    if add and os.path.exists(manifest_path):
        with open(manifest_path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    known = {place[0] for place in manifest["places"]}
    for place in places:
        if place.path in known:
            continue
        known.add(place.path)
        manifest["places"].append(list(place))
        for path, item in scan(root, place):
            if node_owned(path):
                continue
            manifest["entries"][path] = item
            if item["kind"] == "file":
                copy = os.path.join(home, "files") + path
                os.makedirs(os.path.dirname(copy), exist_ok=True)
                shutil.copyfile(root.rstrip("/") + path, copy, follow_symlinks=False)
    os.makedirs(home, exist_ok=True)
    write_text(manifest_path, json.dumps(manifest, sort_keys=True, indent=0) + "\n", 0o644)
    return manifest


def write_text(path: str, text: str, mode: int) -> None:
    descriptor, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".ddp-reset-")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise


def load(home: str = HOME) -> dict[str, Any]:
    """The image's manifest, with what ``record --add`` wrote joined to it; ResetError when it is missing or
    unreadable."""
    manifest: dict[str, Any] = {"places": [], "entries": {}}
    for name in ("manifest.json", ADDED):
        path = os.path.join(home, name)
        if name == ADDED and not os.path.lexists(path):
            continue
        try:
            with open(path, encoding="utf-8") as handle:
                found = json.load(handle)
            if not isinstance(found.get("places"), list) or not isinstance(found.get("entries"), dict):
                raise ValueError("no places or entries")
        except (OSError, ValueError, AttributeError) as error:
            raise ResetError(
                f"the image's manifest {path} cannot be read ({error}): this node's start files cannot be"
                f" checked. {RECREATE}"
            ) from error
        manifest["places"] += found["places"]
        manifest["entries"].update(found["entries"])
    return manifest


def never_image(path: str) -> bool:
    """Whether ``path`` is ``/`` or under :data:`NOT_IMAGE` (never a place of the manifest's)."""
    return path == "/" or any(path == kept or path.startswith(kept + "/") for kept in NOT_IMAGE)


def node_owned(path: str) -> bool:
    return any(path == owned or path.startswith(owned + "/") for owned in NODE_OWNED)


def differs(want: dict[str, Any], have: dict[str, Any] | None) -> str:
    """Why ``have`` is not ``want`` ('' when it is)."""
    if have is None:
        return "it was missing"
    if have["kind"] != want["kind"]:
        return f"it was a {have['kind']}, the image has a {want['kind']}"
    if want["kind"] == "link" and have["target"] != want["target"]:
        return f"it pointed at {have['target']}"
    if want["kind"] == "file" and have["sha256"] != want["sha256"]:
        return "its content differed from the image's"
    if want["kind"] in ("file", "dir") and have["mode"] != want["mode"]:
        return f"its mode was {oct(have['mode'])}"
    return ""


def remove(path: str) -> None:
    if os.path.ismount(path):
        raise ResetError(f"{path} is a mount point, not the image's: it is left as it is. {RECREATE}")
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def put_back(root: str, home: str, path: str, want: dict[str, Any]) -> str:
    """Make ``path`` the image's ``want`` again; '' or why it cannot be."""
    target = root.rstrip("/") + path
    have = entry(target, with_digest=False)
    if want["kind"] == "dir":
        if have is not None and have["kind"] != "dir":
            remove(target)
            have = None
        if have is None:
            os.mkdir(target)
        os.chmod(target, want["mode"])
        return ""
    if have is not None:
        remove(target)
    if want["kind"] == "link":
        os.symlink(want["target"], target)
        return ""
    copy = os.path.join(home, "files") + path
    try:
        copied = digest(copy)
    except OSError as error:
        return f"its copy {copy} cannot be read ({error.strerror or error})"
    if copied != want["sha256"]:
        return f"its copy {copy} is not the image's either (changed in this container)"
    descriptor, temporary = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".ddp-reset-")
    os.close(descriptor)
    try:
        shutil.copyfile(copy, temporary)
        os.chmod(temporary, want["mode"])
        os.replace(temporary, target)
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise
    return ""


def within(path: str, place: Place) -> bool:
    """Whether ``path`` belongs to ``place`` (for a ``top`` place: the directory or one of its entries)."""
    if path == place.path:
        return True
    if not path.startswith(place.path.rstrip("/") + "/"):
        return False
    return place.scope == "tree" or "/" not in path[len(place.path.rstrip("/")) + 1 :]


class Outcome(NamedTuple):
    """What a reset undid (one line each) and what it could not (each naming the path and the fix)."""

    undone: list[str]
    refused: list[str]


def reset(manifest: dict[str, Any], root: str = "/", home: str = HOME, check: bool = False) -> Outcome:
    """Every place of ``manifest`` under ``root`` made the image's again (``check``: only said); see the
    module's docstring."""
    entries: dict[str, dict[str, Any]] = manifest["entries"]
    undone: list[str] = []
    refused: list[str] = []
    places = [Place(str(place[0]), str(place[1])) for place in manifest["places"]]
    places = [place for place in places if not never_image(place.path)]
    # Parents first (a directory put back before the files in it); a place inside another is its own.
    for place in sorted(places, key=lambda place: place.path):
        inner = [other for other in places if other.path != place.path and within(other.path, place)]
        wanted = sorted(
            path
            for path in entries
            if within(path, place) and not any(within(path, other) for other in inner)
        )
        present = {
            path: item
            for path, item in scan(root, place)
            if not node_owned(path) and not any(within(path, other) for other in inner)
        }
        for path in sorted(set(present) - set(wanted), reverse=True):
            if any(path.startswith(gone.rstrip("/") + "/") for gone in present if gone not in wanted):
                continue  # under a directory removed whole
            undone.append(f"removed {path} (the image has none there)")
            if not check:
                remove(root.rstrip("/") + path)
        for path in wanted:
            want = entries[path]
            have = present.get(path)
            why = differs(want, have)
            if not why:
                continue
            if want["kind"] == "dir" and place.scope == "top" and path != place.path:
                refused.append(
                    f"{path} is no longer the image's directory ({why}): its content cannot be put back."
                    f" {RECREATE}"
                )
                continue
            problem = "" if check else put_back(root, home, path, want)
            if problem:
                refused.append(f"{path} cannot be put back ({why}): {problem}. {RECREATE}")
            else:
                undone.append(f"restored {path} ({why})")
    more_undone, more_refused = node_files(root, check)
    return Outcome(undone + more_undone, refused + more_refused)


def node_files(root: str, check: bool) -> tuple[list[str], list[str]]:
    """The node's own files that let logins in, checked: the authorized keys hold the cluster's key only
    (another key's line is removed), sshd_config.d's file names only the port, the address and the host keys
    (anything else refuses: the container's restart writes it anew)."""
    undone: list[str] = []
    refused: list[str] = []
    keys = root.rstrip("/") + AUTHORIZED_KEYS
    cluster_key = public_key(root.rstrip("/") + NODE_KEY)
    if cluster_key and os.path.isfile(keys) and not os.path.islink(keys):
        with open(keys, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
        kept = [line for line in lines if cluster_key in line.split()]
        if kept != lines:
            undone.append(
                f"removed {len(lines) - len(kept)} line(s) of {AUTHORIZED_KEYS} that authorized another key"
                " than the cluster's"
            )
            if not check:
                write_text(keys, "".join(line + "\n" for line in kept), 0o644)
    elif os.path.islink(keys):
        undone.append(f"removed {AUTHORIZED_KEYS} (a link; site.yml writes it again)")
        if not check:
            os.unlink(keys)
    conf = root.rstrip("/") + SSHD_NODE_CONF
    if os.path.lexists(conf):
        try:
            with open(conf, encoding="utf-8", errors="replace") as handle:
                words = [line.split() for line in handle.read().splitlines() if line.strip()]
            bad = [" ".join(word) for word in words if word[0].lower() not in SSHD_NODE_KEYWORDS]
        except OSError as error:
            bad = [f"({error.strerror or error})"]
        if os.path.islink(conf) or bad:
            refused.append(
                f"{SSHD_NODE_CONF} holds more than the port, the address and the host keys"
                f" ({'; '.join(bad)[:200] or 'a link'}): restart the node container (docker restart NODE on"
                " its server), whose start writes it anew"
            )
    return undone, refused


def public_key(private: str) -> str:
    """The base64 part of the public half of the key at ``private`` ('' when it cannot be read)."""
    try:
        done = subprocess.run(
            ["ssh-keygen", "-y", "-f", private], capture_output=True, text=True, check=False, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    words = done.stdout.split()
    return words[1] if done.returncode == 0 and len(words) >= 2 else ""


def running(jobs_dir: str) -> list[int]:
    """The processes (but this one) whose command line names a job's directory under ``jobs_dir``: a job
    runs on the node (as :mod:`ddp_cluster.supervisor.jobs` counts them)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                line = handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if f"{jobs_dir.rstrip('/')}/" in line:
            found.append(int(name))
    return found


def command(jobs_dir: str = "", check: bool = False) -> str:
    """The shell command that resets a node (unless a job runs there, under ``jobs_dir``): the node's Python
    with no site, no user site and no PYTHON* variable, in a clean environment (what a job left in env.sh
    does not reach it)."""
    words = [PYTHON, "-I", "-S", SCRIPT, "reset"]
    words += ["--unless-running", jobs_dir] if jobs_dir else []
    words += ["--check"] if check else []
    failed = shlex.quote(
        f"{REFUSED}the reset of the image's start files did not run: {PYTHON} -I -S {SCRIPT} failed, as said"
        " above; the node runs an image older than its check, or one a job changed. Remove the node's"
        " container on its server and run ansible-playbook site.yml --limit NODE, which makes it anew"
    )
    line = "env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin " + " ".join(shlex.quote(word) for word in words)
    return f"{{ {line} 2>&1 || echo {failed}; }}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("record", "reset"))
    parser.add_argument("--root", default="/", help="the tree the paths are in (tests)")
    parser.add_argument("--home", default=HOME, help="the manifest's directory")
    parser.add_argument("--python", default=PYTHON, help="record: the Python whose start files are recorded")
    parser.add_argument("--add", nargs="*", default=None, help="record: these trees, added to the manifest")
    parser.add_argument("--check", action="store_true", help="reset: only say what differs")
    parser.add_argument(
        "--unless-running", default="", help="reset: nothing while a job runs under this jobs' directory"
    )
    args = parser.parse_args(argv)
    if args.action == "reset" and args.unless_running and running(args.unless_running):
        # A job runs here: what it changed stays until it ends (the check refuses or waits for the node).
        print(f"{SKIPPED}a job runs on this node")
        return 0
    try:
        if args.action == "record":
            places = [Place(path, "tree") for path in args.add] if args.add else default_places(args.python)
            manifest = record(places, args.root, args.home, add=args.add is not None)
            print(f"image manifest: {len(manifest['entries'])} entries in {len(manifest['places'])} places")
            return 0
        outcome = reset(load(args.home), args.root, args.home, args.check)
    except (ResetError, OSError) as error:
        print(f"{REFUSED}{error}")
        return 0
    for line in outcome.undone:
        print(f"{UNDONE}{line}")
    for line in outcome.refused:
        print(f"{REFUSED}{line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
