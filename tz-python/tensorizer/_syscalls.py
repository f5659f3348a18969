"""
Thin wrappers over Linux system calls that have no ``os`` function:
``fallocate(2)`` and ``madvise(2)``, looked up in the C library through
ctypes (upstream's ``tensorizer._syscalls`` names and behaviour). Where a
call is missing (not Linux, an old libc) the helpers say so rather than fail.
"""

import ctypes
import errno
import mmap
from typing import Callable, Optional

__all__ = ("has_fallocate", "try_fallocate", "prefault")

try:
    _libc = ctypes.CDLL(None, use_errno=True)
except (OSError, TypeError):  # TypeError: platforms where CDLL(None) is refused
    _libc = None


def _lookup(name: str, argtypes) -> Optional[Callable]:
    fn = getattr(_libc, name, None) if _libc is not None else None
    if fn is None:
        return None
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


_fallocate_fn = _lookup("fallocate", [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64])
_madvise_fn = _lookup("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])


def _checked(rc: int) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, errno.errorcode.get(err, "Unknown error"))


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """``fallocate(2)``; raises OSError (with errno) when it fails, and
    OSError(ENOSYS) where the call does not exist."""
    if _fallocate_fn is None:
        raise OSError(errno.ENOSYS, "fallocate is not available")
    _checked(_fallocate_fn(fd, mode, offset, length))


def has_fallocate() -> bool:
    """Whether ``fallocate(2)`` can be called on this system."""
    return _fallocate_fn is not None


def try_fallocate(fd: int, offset: int, length: int, suppress_all_errors: bool = False) -> bool:
    """
    Reserves `length` bytes of file `fd` from `offset` (``fallocate(2)``,
    mode 0: the file grows to cover the range).

    Returns True if space was allocated, False if ``fallocate`` is not
    available, the file system does not support it (EOPNOTSUPP), or the call
    failed and `suppress_all_errors` is set. Raises OSError for other failures.
    """
    if _fallocate_fn is None:
        return False
    try:
        fallocate(fd, 0, offset, length)
    except OSError as e:
        if suppress_all_errors or e.errno == errno.EOPNOTSUPP:
            return False
        raise
    return True


# MADV_POPULATE_WRITE (Linux 5.14+): fault pages in, writable, without
# touching their contents.
_MADV_POPULATE_WRITE = 23


def _madvise_populates() -> bool:
    if _madvise_fn is None:
        return False
    n = mmap.PAGESIZE
    with mmap.mmap(-1, n, flags=getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)) as m:
        buf = (ctypes.c_ubyte * n).from_buffer(m)
        try:
            return _madvise_fn(ctypes.addressof(buf), n, _MADV_POPULATE_WRITE) == 0
        finally:
            del buf


if _madvise_populates():

    def prefault(address, length: int) -> None:
        """Makes the `length` bytes at `address` resident and writable."""
        _checked(_madvise_fn(address, length, _MADV_POPULATE_WRITE))

else:

    def prefault(address, length: int) -> None:
        """Makes the `length` bytes at `address` resident and writable (by
        writing zeros: this kernel cannot populate pages on request)."""
        ctypes.memset(address, 0, length)
