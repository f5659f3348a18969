"""
tensorizer: fast serialization and deserialization of PyTorch tensors,
modules and state dicts, backed by the native libtensorizer library.

API-compatible with the Python tensorizer 2.12.1 package.
"""

from ._install import check_no_upstream as _check_no_upstream

_check_no_upstream(__path__[0])
__distribution__ = "tensorizer-native"  # see _install.check_package_is_ours

from . import serialization, stream_io, torch_compat, utils  # noqa: E402
from ._version import __version__  # noqa: E402
from .serialization import *  # noqa: F401,F403,E402

__all__ = [
    *serialization.__all__,
    "stream_io",
    "torch_compat",
    "utils",
    "protobuf",
    "tensors_pb2",
]

# The legacy protobuf serializer loads on first use, so importing tensorizer
# does not import the protobuf runtime.
_LAZY_SUBMODULES = ("protobuf", "tensors_pb2")


def __getattr__(name):
    # The native library is loaded lazily; its version is read on demand.
    if name == "__native_version__":
        from ._native import native_version

        return native_version()
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
