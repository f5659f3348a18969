"""tensorizer._syscalls: fallocate(2) and prefaulting, as upstream's module."""

import ctypes
import errno
import mmap
import os
import tempfile

import pytest

from tensorizer import _syscalls


def test_try_fallocate_grows_the_file():
    with tempfile.TemporaryFile() as f:
        assert _syscalls.try_fallocate(f.fileno(), offset=50, length=1000) is _syscalls.has_fallocate()
        assert os.fstat(f.fileno()).st_size == (1050 if _syscalls.has_fallocate() else 0)


@pytest.mark.skipif(not _syscalls.has_fallocate(), reason="no fallocate(2) here")
def test_try_fallocate_errors():
    with tempfile.TemporaryFile() as f:
        with pytest.raises(OSError) as ei:
            _syscalls.try_fallocate(f.fileno(), offset=-1, length=0)
        assert ei.value.errno == errno.EINVAL
        assert _syscalls.try_fallocate(f.fileno(), offset=-1, length=0, suppress_all_errors=True) is False
        assert os.fstat(f.fileno()).st_size == 0
    r, w = os.pipe()
    try:
        with pytest.raises(OSError):  # ESPIPE: not a regular file
            _syscalls.try_fallocate(w, offset=0, length=1000)
    finally:
        os.close(r)
        os.close(w)


def test_try_fallocate_treats_an_unsupported_file_system_as_false(monkeypatch):
    def unsupported(fd, mode, offset, length):
        ctypes.set_errno(errno.EOPNOTSUPP)
        return -1

    monkeypatch.setattr(_syscalls, "_fallocate_fn", unsupported)
    assert _syscalls.try_fallocate(0, 0, 10) is False
    monkeypatch.setattr(_syscalls, "_fallocate_fn", None)
    assert _syscalls.has_fallocate() is False
    assert _syscalls.try_fallocate(0, 0, 10) is False


def test_prefault_keeps_memory_usable():
    n = 4 * mmap.PAGESIZE
    with mmap.mmap(-1, n) as m:
        buf = (ctypes.c_ubyte * n).from_buffer(m)
        try:
            _syscalls.prefault(ctypes.addressof(buf), n)
            _syscalls.prefault(ctypes.byref(buf), n)  # upstream's callers pass byref()
            buf[n - 1] = 7
        finally:
            del buf
        assert m[n - 1] == 7
