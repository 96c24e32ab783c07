"""files.py: the directory lock, beside the temporaries' tests in test_preprocess.py and test_faults.py."""

import os

import pytest

from nmt_cli import files
from nmt_cli.errors import NmtError
from nmt_cli.files import DirectoryLock


def test_a_lock_is_held_once_and_names_its_holder(tmp_path):
    with DirectoryLock(tmp_path / ".lock", "the directory"):
        with pytest.raises(NmtError, match=f"the directory is in use by process {os.getpid()} on "):
            DirectoryLock(tmp_path / ".lock", "the directory").acquire()
    assert not (tmp_path / ".lock").exists()
    with DirectoryLock(tmp_path / ".lock", "the directory"):  # free again once released
        pass


def test_a_lock_that_cannot_be_created_is_one_line(tmp_path):
    with pytest.raises(NmtError, match=r"missing/.lock: cannot create the lock of the directory \(No such file"):
        DirectoryLock(tmp_path / "missing/.lock", "the directory").acquire()


def test_a_lock_file_removed_by_its_holder_meanwhile_is_not_trusted(tmp_path, monkeypatch):
    """The holder released (and removed) the file between our open and our lock: lock the new one."""
    path = tmp_path / ".lock"
    real_open, opened = os.open, []

    def open_then_replaced(name, flags, mode=0o777):
        fd = real_open(name, flags, mode)
        if not opened:  # the first file is removed and made again by someone else
            os.unlink(name)
            real_open(name, flags, mode)
        opened.append(fd)
        return fd

    monkeypatch.setattr(files.os, "open", open_then_replaced)
    lock = DirectoryLock(path, "the directory").acquire()
    assert len(opened) == 2 and os.fstat(lock.fd).st_ino == os.stat(path).st_ino
    lock.release()



def test_a_kill_at_any_step_of_writing_a_directory_leaves_nothing_the_next_run_keeps(tmp_path, monkeypatch):
    """Killed right after the temporary directory's mkdir (no marker yet), or while the finished
    one replaces the old (moved aside, not yet removed), or before the new one's marker goes: the
    leftovers are swept by the next run, and the published directory can be replaced again."""
    from nmt_cli import files

    dead = 2**22 + 4321  # above the kernel's default pid_max: no process has it
    empty = tmp_path / f".out.nmt-tmp-{files.HOST}-{dead}-0123456789abcdef"
    empty.mkdir()
    files.remove_stale_temporaries(tmp_path)
    assert not empty.exists()

    def write(content):
        return lambda tmp: (tmp / "f.txt").write_text(content)

    out = tmp_path / "out"
    files.write_directory(out, "directory", write("first"), lambda: None)
    assert sorted(p.name for p in out.iterdir()) == ["f.txt"]

    def killed(path, *args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:  # killed before the old directory, moved aside, is removed
        patch.setattr(files.shutil, "rmtree", killed)
        with pytest.raises(KeyboardInterrupt):
            files.write_directory(out, "directory", write("second"), lambda: None)
    assert (out / "f.txt").read_text() == "second"
    leftovers = list(tmp_path.glob(".out.nmt-tmp-*"))
    assert leftovers and all((p / files.MARKER).is_file() for p in leftovers)  # marked: the sweep may take them
    monkeypatch.setattr(files, "_alive", lambda pid: False)
    files.remove_stale_temporaries(tmp_path)
    assert not list(tmp_path.glob(".out.nmt-tmp-*"))


def test_an_output_overlaps_an_input_as_itself_inside_it_or_holding_it(tmp_path):
    (tmp_path / "data").mkdir()
    source = tmp_path / "data/train.bin"
    source.write_bytes(b"ids")
    (tmp_path / "link").symlink_to(source)
    assert files.overlap(source, source) == files.overlap(tmp_path / "link", source) == "is"
    assert files.overlap(tmp_path / "data/new.txt", tmp_path / "data") == "is inside"
    assert files.overlap(tmp_path / "data", source) == "holds"
    assert files.overlap(tmp_path / "other.bin", source) is None
    assert files.overlap(tmp_path / "data/new.txt", source) is None  # beside an input file: no harm
    with pytest.raises(NmtError, match=r"^.*link: is the input .*train.bin: writing the shortlist there would destroy"):
        files.destination(tmp_path / "link", "shortlist", inputs=[source])
    assert source.read_bytes() == b"ids"


def test_a_small_file_is_a_regular_file_within_its_limit(tmp_path):
    """Options, keys, a tokenizer's model: never a device that never ends, a FIFO (read without
    waiting for a writer), a directory, or data given by mistake; each refused in one line."""
    (tmp_path / "ok").write_bytes(b"12345")
    assert files.small_file(tmp_path / "ok", "a thing", 5) == b"12345"
    (tmp_path / "zero").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo")
    for name, message in (("zero", "a character device, not a regular file (a thing is one)"),
                          ("fifo", "a FIFO, not a regular file (a thing is one)"),
                          (".", "a directory, not a regular file (a thing is one)"),
                          ("ok", "5 bytes; a thing is at most 4"),
                          ("gone", "cannot read a thing (No such file or directory)")):
        with pytest.raises(NmtError) as caught:
            files.small_file(tmp_path / name, "a thing", 4)
        assert str(caught.value) == f"{tmp_path / name}: {message}"
