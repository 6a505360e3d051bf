"""Insecure mode without a mount namespace keeps scratch directories in the host's /tmp and
removes them itself: without recursion and without raising, whatever a child left."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

JAIL = Path(__file__).resolve().parents[2] / "src" / "toolkiln" / "sandbox" / "jail"
sys.path.insert(0, str(JAIL))
import template  # noqa: E402  (the template's own module, as the jail imports it)
from config import JailConfig  # noqa: E402


def test_a_deep_tree_with_files_and_links_is_removed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    scratch = tmp_path / "60001"
    scratch.mkdir()
    here = os.getcwd()
    try:
        os.chdir(scratch)
        for i in range(3000):  # deeper than shutil.rmtree's recursion goes
            Path("f").write_text(str(i))
            os.symlink(outside, "link")
            os.mkdir("d")
            os.chdir("d")
    finally:
        os.chdir(here)
    template.remove_tree(str(scratch))
    assert not scratch.exists()
    assert (outside / "keep.txt").read_text() == "mine"  # a link is removed, not followed


def test_a_missing_or_unreadable_tree_does_not_raise(tmp_path: Path) -> None:
    template.remove_tree(str(tmp_path / "never-made"))
    locked = tmp_path / "locked"
    (locked / "inner").mkdir(parents=True)
    os.chmod(locked, 0o000)
    try:
        template.remove_tree(str(locked))  # as root it goes; else it stays, quietly
    finally:
        if locked.exists():
            os.chmod(locked, 0o700)


def _remove_with_a_swap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scratch: Path, name: str
) -> None:
    """Removes ``scratch`` while another process, just before the walk first goes into
    ``name``, renames that directory away and puts a link to a directory outside in its
    place: the walk notices where it landed and stops, and what is outside stays."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    real_chdir = os.chdir
    swapped = []

    def chdir(target: str | os.PathLike[str]) -> None:
        if str(target) == name and not swapped:
            os.rename(name, name + ".moved")
            os.symlink(outside, name)
            swapped.append(True)
        real_chdir(target)

    monkeypatch.setattr(os, "chdir", chdir)
    template.remove_tree(str(scratch))
    monkeypatch.undo()
    assert swapped and (outside / "keep.txt").read_text() == "mine"


def test_a_directory_swapped_for_a_link_mid_walk_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "60002"
    (scratch / "d").mkdir(parents=True)
    _remove_with_a_swap(tmp_path, monkeypatch, scratch, "d")


def test_a_scratch_replaced_by_a_link_is_not_followed(tmp_path: Path) -> None:
    """In insecure mode a call's scratch is a name in the host's /tmp that its tool owns: it
    can rename its directory away and put a link (to /etc, say) in its place before it ends.
    The template, as root, removes the link, never what it points to (found by review)."""
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "keep.txt").write_text("mine")
    scratch = tmp_path / "60003"
    os.symlink(outside, scratch)
    template.remove_tree(str(scratch))
    assert not os.path.lexists(scratch)
    assert (outside / "keep.txt").read_text() == "mine"
    assert (outside / "sub").is_dir()


def test_a_scratch_swapped_for_a_link_after_it_was_seen_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap between the template's look at the scratch and its chdir into it."""
    scratch = tmp_path / "60004"
    scratch.mkdir()
    _remove_with_a_swap(tmp_path, monkeypatch, scratch, str(scratch))


def test_a_uid_root_whose_tmpfs_could_not_be_mounted_again_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tmpfs of a uid detached, and a new one failing to mount: the walk that follows
    removed /tmp/<uid> itself (no longer a mount point), and every later try failed, so
    the uid stayed out of use for good (found by review). The root is made again."""
    uid = 1_980_000_000 + os.getpid() % 1_000_000
    root = Path(template.scratch_root(uid))
    root.mkdir(mode=0o711, parents=True)
    (root / "left").write_text("x")
    failures = [OSError(errno.ENOMEM, "no memory for a tmpfs")]

    def mount(*args: object) -> None:
        if failures:
            raise failures.pop()

    monkeypatch.setattr(template.linux, "umount2", lambda *args: None)
    monkeypatch.setattr(template.linux, "mount", mount)
    cfg = JailConfig("python", (), "", (), scratch_mb=1, scratch_files=16)
    tpl = template.Template(cfg, None, None)  # type: ignore[arg-type]
    try:
        assert tpl.empty(uid, str(root / "7")) is False  # emptied by the walk
        assert root.is_dir() and not list(root.iterdir())
        assert tpl.empty(uid, str(root / "8")) is False  # and the next try mounts again
    finally:
        subprocess.run(["rm", "-rf", str(root.parent)], check=False)
