"""
tensorizer: fast serialization and deserialization of PyTorch tensors,
modules and state dicts, backed by the native libtensorizer library.

API-compatible with the Python tensorizer 2.12.1 package.
"""

from . import serialization, stream_io, torch_compat, utils
from ._version import __version__
from .serialization import *  # noqa: F401,F403

__all__ = [
    *serialization.__all__,
    "stream_io",
    "torch_compat",
    "utils",
]


def __getattr__(name):
    # The native library is loaded lazily; its version is read on demand.
    if name == "__native_version__":
        from ._native import native_version

        return native_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
