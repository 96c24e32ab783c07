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
