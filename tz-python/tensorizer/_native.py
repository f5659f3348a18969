"""
Binding to libtensorizer (the C ABI declared in ``tz-capi/include/tensorizer.h``)
through cffi in ABI mode.

The declarations are not written here: ``_cdef.py`` is generated from
tensorizer.h when the package is built (``build_backend/gen_cdef.py``), so
they cannot drift from the header. ``ffi`` is available as soon as this module
imports; ``lib`` is loaded on first access, so that the pure-Python parts of
the package can be imported and tested without the shared library.

The library is looked up, in order:

1. at the path in the ``TENSORIZER_LIBRARY`` environment variable (authoritative:
   nothing else is tried when it is set),
2. as ``libtensorizer.so.0`` bundled next to this file (a wheel, or a
   development build, which copies it there),
3. as the system's ``libtensorizer.so.0``, through the dynamic linker's normal
   search path (a distro's python3-tensorizer beside libtensorizer0).

A library whose major version differs from the header's is refused.
"""

import os
import re
import threading
from typing import NoReturn, Optional

import cffi

__all__ = ["ffi", "lib", "check", "raise_error", "library_path", "error_message"]

ffi = cffi.FFI()

try:
    from ._cdef import CDEF
except ImportError as e:  # pragma: no cover - a source tree that was never built
    raise ImportError(
        "tensorizer: the cffi declarations (tensorizer/_cdef.py) are generated"
        " from tensorizer.h at build time and are missing; build the package"
        " (pip install ./tz-python, or make build in a checkout)"
    ) from e

ffi.cdef(CDEF)

_LIBRARY_NAME = "libtensorizer.so.0"
_ENV_VAR = "TENSORIZER_LIBRARY"

_load_lock = threading.Lock()
_lib = None
_lib_path: Optional[str] = None


def _candidate_paths():
    env = os.environ.get(_ENV_VAR)
    if env:
        # An explicit setting is authoritative: no fallback to other copies.
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    bundled = os.path.join(here, _LIBRARY_NAME)
    # A bare name makes dlopen search the linker path (ld.so.cache, LD_LIBRARY_PATH).
    return [bundled] if os.path.exists(bundled) else [_LIBRARY_NAME]


def _load():
    global _lib, _lib_path
    with _load_lock:
        if _lib is not None:
            return _lib
        candidates = _candidate_paths()
        errors = []
        for path in candidates:
            if os.sep in path and not os.path.exists(path):
                errors.append(f"{path}: not found")
                continue
            try:
                loaded = ffi.dlopen(path)
            except OSError as e:
                errors.append(f"{path}: {e}")
                continue
            found = ffi.string(loaded.tz_version()).decode("ascii", "replace")
            if found.split(".")[0] != str(loaded.TZ_VERSION_MAJOR):
                errors.append(
                    f"{path}: version {found}, but this package was built for"
                    f" {loaded.TZ_VERSION_MAJOR}.x"
                )
                continue
            _lib, _lib_path = loaded, _loaded_path(path)
            globals()["lib"] = loaded
            return loaded
        raise ImportError(
            "tensorizer: could not load the native library "
            f"{_LIBRARY_NAME}. Install a wheel that bundles it, install the"
            f" system library (libtensorizer0), or set {_ENV_VAR} to its"
            " path. Tried:\n  " + "\n  ".join(errors)
        )


def _loaded_path(name: str) -> str:
    # For a library found through the linker path: where it was mapped from.
    if os.sep in name:
        return name
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)
                # The mapped file is the soname's target, e.g. libtensorizer.so.0.2.0.
                if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith(name):
                    return fields[5].strip()
    except OSError:
        pass
    return name


def __getattr__(name):
    # PEP 562: load the shared library lazily, on first access to `lib`.
    if name == "lib":
        return _load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def library_path() -> str:
    """Path of the loaded shared library (loads it if needed)."""
    _load()
    return _lib_path


def native_version() -> str:
    return ffi.string(_load().tz_version()).decode("utf-8", "replace")


def error_message() -> str:
    """The message of the last libtensorizer failure on this thread."""
    raw = _load().tz_error_last()
    if raw == ffi.NULL:
        return ""
    return ffi.string(raw).decode("utf-8", "replace")


_VERSION_RE = re.compile(r"data version (\d+)")


def _exception_for(rc: int, message: str) -> BaseException:
    # Imported here: these modules import this one.
    L = _load()
    if not message:
        message = ffi.string(L.tz_status_name(rc)).decode("ascii", "replace")
    if rc == L.TZ_E_VERSION:
        from .serialization import _FileHeader

        m = _VERSION_RE.search(message)
        version = int(m.group(1)) if m else -1
        return _FileHeader.InvalidVersionError(message, version=version)
    if rc == L.TZ_E_HASH:
        from .serialization import HashMismatchError

        return HashMismatchError(message)
    if rc == L.TZ_E_CRYPTO:
        from . import CryptographyError

        return CryptographyError(message)
    if rc in (
        L.TZ_E_FORMAT,
        L.TZ_E_TRUNCATED,
        L.TZ_E_CONFLICT,
        L.TZ_E_INVALID_ARG,
        L.TZ_E_UNSUPPORTED,
    ):
        return ValueError(message)
    if rc == L.TZ_E_NOT_FOUND:
        return FileNotFoundError(message)
    if rc == L.TZ_E_IO:
        return OSError(message)
    if rc == L.TZ_E_NOMEM:
        return MemoryError(message)
    if rc == L.TZ_E_LIMIT:
        return RuntimeError(message)
    return RuntimeError(message)


def raise_error(rc: int, message: Optional[str] = None) -> NoReturn:
    """Raise the Python exception for the libtensorizer status `rc`."""
    if message is None:
        message = error_message()
    raise _exception_for(rc, message)


def check(rc: int) -> int:
    """Return `rc` if it is TZ_OK (0), else raise the matching exception.

    Must be called on the same thread, right after the failing call, since
    the message comes from thread-local storage in the library.
    """
    if rc != 0:
        raise_error(rc)
    return rc
