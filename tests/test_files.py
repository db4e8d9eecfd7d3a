"""runner/files.py: atomic writes leave the target either old or new, never partial, and no
temporary file behind."""
from __future__ import annotations

import os

import pytest

from runner import files


def _listing(folder):
    return sorted(p.name for p in folder.iterdir())


def test_text_and_bytes_round_trip(tmp_path):
    files.atomic_write_text(tmp_path / "a.txt", "héllo\nwörld\n")
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "héllo\nwörld\n"
    files.atomic_write_bytes(tmp_path / "b.bin", b"\x00\xff\x10")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff\x10"
    files.atomic_write_bytes(tmp_path / "b.bin", b"second", fsync=True)  # an existing file is replaced
    assert (tmp_path / "b.bin").read_bytes() == b"second"
    assert _listing(tmp_path) == ["a.txt", "b.bin"]


def test_newline_passes_through(tmp_path):
    files.atomic_write_text(tmp_path / "crlf.txt", "a\nb\n", newline="\r\n")
    assert (tmp_path / "crlf.txt").read_bytes() == b"a\r\nb\r\n"


def test_the_temporary_file_is_a_hidden_sibling(tmp_path):
    target = tmp_path / "sub" / "result.json"
    target.parent.mkdir()
    with files.atomic_path(target) as tmp:
        assert tmp.parent == target.parent  # same folder: same filesystem, os.replace is atomic
        assert tmp.name.startswith(".result.json.") and tmp.name.endswith(".tmp")
        assert str(os.getpid()) in tmp.name
        tmp.write_text("new")
        assert not target.exists()  # nothing at the target until the block ends
    assert target.read_text() == "new"
    assert _listing(target.parent) == ["result.json"]
    assert files.temp_sibling(target) != files.temp_sibling(target)  # unique per call


def test_a_failure_inside_atomic_path_keeps_the_old_content(tmp_path):
    target = tmp_path / "result.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="killed"):
        with files.atomic_path(target) as tmp:
            tmp.write_text("half of the ne")
            raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert _listing(tmp_path) == ["result.json"]  # the temporary file is gone


def test_a_failure_inside_atomic_open_keeps_the_old_content(tmp_path):
    target = tmp_path / "train.csv"
    target.write_text("old")
    with pytest.raises(KeyboardInterrupt):  # not only Exception: a stop signal too
        with files.atomic_open(target, "w", newline="") as f:
            f.write("partial")
            f.flush()
            raise KeyboardInterrupt
    assert target.read_text() == "old"
    assert _listing(tmp_path) == ["train.csv"]


def test_a_failure_before_the_first_write_leaves_no_target(tmp_path):
    with pytest.raises(ValueError):
        with files.atomic_path(tmp_path / "never"):
            raise ValueError
    assert _listing(tmp_path) == []


def test_atomic_open_refuses_appending(tmp_path):
    with pytest.raises(ValueError, match="whole file"):
        with files.atomic_open(tmp_path / "log", "a"):
            pass


def test_atomic_path_for_writers_that_need_a_path(tmp_path):
    # os.link (numbered checkpoints are hard links to checkpoint_last.pt) and a writer by path
    last = tmp_path / "last"
    last.write_bytes(b"weights")
    with files.atomic_path(tmp_path / "numbered") as tmp:
        os.link(last, tmp)
    assert os.path.samefile(last, tmp_path / "numbered")
    with files.atomic_path(tmp_path / "synced", fsync=True) as tmp:
        tmp.write_bytes(b"x")
    assert (tmp_path / "synced").read_bytes() == b"x"
    assert _listing(tmp_path) == ["last", "numbered", "synced"]


def test_remove_stale_clears_only_that_files_temporaries(tmp_path):
    target = tmp_path / "c.pt"
    (tmp_path / ".c.pt.k1ll3d.tmp").write_bytes(b"torn")
    (tmp_path / ".c.pt.123.4.tmp").write_bytes(b"torn")
    (tmp_path / ".other.pt.123.4.tmp").write_bytes(b"someone else's")
    files.remove_stale(target)
    assert _listing(tmp_path) == [".other.pt.123.4.tmp"]
