"""
TensorSerializer and TensorDeserializer: the tensorizer Python API, on top of
libtensorizer (see ``tensorizer._native``).

The native library does all file parsing, hashing, and bulk I/O. This module
turns torch tensors, modules and nested state dicts into write requests, and
read results into ``torch.nn.Parameter`` objects, without ever copying tensor
data in Python: bytes go straight between the file and tensor memory.
"""

import collections.abc
import contextlib
import dataclasses
import enum
import errno
import gc
import io
import itertools
import logging
import mmap
import operator
import os
import stat
import struct
import tempfile
import threading
import time
import types
import typing
import zlib
from enum import IntEnum
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy
import torch

import tensorizer._crypt as _crypt
from tensorizer._crypt import DecryptionParams, EncryptionParams
import tensorizer._dtypes as _dtypes
import tensorizer._syscalls as _syscalls
import tensorizer._tensor_path as _tensor_path
import tensorizer.stream_io as stream_io
import tensorizer.utils as utils
from tensorizer import _native
from tensorizer._native import ffi

__all__ = [
    "TensorSerializer",
    "TensorDeserializer",
    "TensorType",
    "CryptographyError",
    "EncryptionParams",
    "DecryptionParams",
    "FilterFuncType",
]

logger = logging.getLogger(__name__)


class _SupportsBool(typing.Protocol):
    def __bool__(self) -> bool: ...


# Filter functions get a plain str for a top-level string key, otherwise a
# tuple of path components (each str or int).
FilterFuncType: "typing.TypeAlias" = Callable[
    [Union[str, Sequence[Union[str, int]]]], _SupportsBool
]


# What TensorSerializer and TensorDeserializer accept as file_obj.
_FileLike = Union[io.BufferedIOBase, io.RawIOBase, typing.BinaryIO, str, bytes, os.PathLike, int]


class CryptographyError(_crypt.CryptographyError):
    pass


class TensorType(IntEnum):
    """Whether a tensor was a module parameter, a buffer, or a state_dict entry."""

    PARAM = 0
    BUFFER = 1
    STATE_DICT = 2


# Newest data version
TENSORIZER_VERSION = 5
# Tensors with a dimension of 2^32 or more elements
LONG_TENSOR_TENSORIZER_VERSION = 5
# Meta tensors, stored without data and read back zero-filled
META_TENSOR_TENSORIZER_VERSION = 4
# Encrypted tensor data
ENCRYPTION_TENSORIZER_VERSION = 3
# "Opaque" dtypes that numpy cannot represent (bfloat16, ...)
OPAQUE_TENSORIZER_VERSION = 2
# Everything else
NON_OPAQUE_TENSORIZER_VERSION = 1

TENSORIZER_MAGIC = b"|TZR|"

OPAQUE_DTYPE_SEP = _dtypes.OPAQUE_DTYPE_SEP


class HashType(IntEnum):
    CRC32 = 0
    SHA256 = 1


@dataclasses.dataclass(order=True)
class TensorHash:
    __slots__ = ("type", "hash")
    type: HashType
    hash: bytes


# Loads verify natively; a caller that replaces the module's TensorHash (a
# test double) is honoured by comparing what it builds (see
# TensorDeserializer._check_with_replaced_tensor_hash).
_TensorHash = TensorHash


@dataclasses.dataclass(order=True)
class TensorEntry:
    """What the metadata index says about one tensor."""

    __slots__ = (
        "metadata_version",
        "name",
        "type",
        "dtype",
        "shape",
        "offset",
        "data_offset",
        "data_length",
        "hashes",
        "header_hashes",
    )
    metadata_version: int
    name: tuple
    type: TensorType
    dtype: str
    shape: Tuple[int, ...]
    offset: int
    data_offset: int
    data_length: int
    hashes: Optional[List[TensorHash]]
    header_hashes: Optional[Dict[HashType, Any]]

    @property
    def deserialized_length(self) -> int:
        if self.data_length > 0:
            return self.data_length
        itemsize = _dtypes.decode_dtype(self.dtype).itemsize
        n = 1
        for d in self.shape:
            n *= d
        return itemsize * n

    @property
    def is_long_tensor(self) -> bool:
        return self.metadata_version >= LONG_TENSOR_TENSORIZER_VERSION


class _FileFeatureFlags(enum.IntFlag):
    encrypted = enum.auto()


class _FileHeader:
    """The file header's fields, as a TensorDeserializer read them
    (``_file_header``, upstream's private attribute of the same shape)."""

    __slots__ = ("version_number", "feature_flags", "tensor_size", "tensor_count")

    def __init__(self, version_number: int, feature_flags: int, tensor_size: int, tensor_count: int):
        self.version_number = version_number
        self.feature_flags = _FileFeatureFlags(feature_flags)
        self.tensor_size = tensor_size
        self.tensor_count = tensor_count

    def __repr__(self) -> str:
        return (
            f"_FileHeader(version_number={self.version_number},"
            f" feature_flags={self.feature_flags!r}, tensor_size={self.tensor_size},"
            f" tensor_count={self.tensor_count})"
        )

    class InvalidVersionError(ValueError):
        version: int

        def __init__(self, *args, version: int):
            super().__init__(*args)
            self.version = version


class HashMismatchError(Exception):
    pass


@dataclasses.dataclass
class _PerfStats:
    """Time and bytes spent reading tensor data and moving tensors to their
    device, summed over all deserializers (upstream's private counters)."""

    file_readinto_ns: int = 0
    file_readinto_bytes: int = 0
    tensor_to_device_ns: int = 0
    tensor_to_device_bytes: int = 0
    lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    def add(self, **amounts: int) -> None:
        with self.lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)


# Off unless TENSORIZER_ENABLE_PERF_STATS is set when tensorizer is imported,
# as upstream; readers look _perf_stats up at each load, so assigning a
# _PerfStats() to it turns counting on later.
_enable_perf_stats: bool = bool(os.environ.get("TENSORIZER_ENABLE_PERF_STATS"))
_perf_stats: Optional[_PerfStats] = _PerfStats() if _enable_perf_stats else None


def _get_perf_stats() -> Dict[str, Union[int, float]]:
    """The counters so far: seconds and bytes of reads of tensor data
    (``file_readinto_*``) and of copies to another device
    (``tensor_to_device_*``). RuntimeError when counting is off."""
    stats = _perf_stats
    if stats is None:
        raise RuntimeError("Performance stats are not enabled")
    with stats.lock:
        return dict(
            tensor_to_device_secs=stats.tensor_to_device_ns * 1e-9,
            tensor_to_device_bytes=stats.tensor_to_device_bytes,
            file_readinto_secs=stats.file_readinto_ns * 1e-9,
            file_readinto_bytes=stats.file_readinto_bytes,
        )


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------

_torch_empty = _dtypes._torch_empty
_Parameter = torch.nn.Parameter
_U8_ARRAY = ffi.typeof("uint8_t[]")
_CHAR_ARRAY = ffi.typeof("char[]")
_U64_ARRAY = ffi.typeof("uint64_t[]")
_CONST_VOID_P = ffi.typeof("const void *")
_VOID_P = ffi.typeof("void *")
_TENSOR_TYPES = tuple(TensorType)

# Non-NULL pointer for zero-length buffers
_EMPTY_BUFFER = ffi.new("char[8]")
_EMPTY_PTR = ffi.cast("void *", _EMPTY_BUFFER)

# Staging budget per buffer for CUDA loads (two buffers alternate)
_CUDA_STAGING_BYTES = 256 << 20
_CUDA_STAGING_ALIGN = 256


_gc_lock = threading.Lock()
_gc_depth = 0
_gc_was_enabled = False


@contextlib.contextmanager
def _gc_paused():
    """
    Pause the cyclic garbage collector while creating many objects (it
    otherwise rescans the whole heap repeatedly). Nests across threads.
    """
    global _gc_depth, _gc_was_enabled
    with _gc_lock:
        if _gc_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_was_enabled:
                gc.enable()


def _check_file_mode(file_obj, owner: str, needs: str, mode_hint: str, write: bool) -> None:
    """Raise upstream's ValueError unless file_obj is a binary stream that can
    be read (and written, when `write`)."""
    try:
        ok = file_obj.readable() and (not write or file_obj.writable())
    except AttributeError:
        ok = True
    if isinstance(file_obj, io.TextIOBase) or not ok:
        mode = getattr(file_obj, "mode", "")
        raise ValueError(
            f"{owner}'s file_obj must be {needs} and in binary mode"
            f' (mode="{mode_hint}"' + (f', current mode="{mode}"' if mode else "") + ")"
        )


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _empty_like_entry(e: "_Entry", device) -> torch.Tensor:
    """An uninitialized tensor with the entry's shape and torch dtype."""
    d = e.decoded
    if d.is_opaque:
        # Allocate as the same-width integer and reinterpret: avoids torch's
        # warnings for experimental dtypes (complex32) on allocation
        int_type = _dtypes._INTERMEDIATE_TYPES[d.itemsize]
        return _torch_empty(e.shape, dtype=int_type, device=device).view(
            d.torch_dtype
        )
    return _torch_empty(e.shape, dtype=d.torch_dtype, device=device)


def _proc_fd_path(fd: int) -> Optional[str]:
    """
    A path that re-opens the regular file behind `fd`, or None.
    """
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    for path in (f"/proc/self/fd/{fd:d}", f"/dev/fd/{fd:d}"):
        try:
            st2 = os.stat(path)
        except OSError:
            continue
        if os.path.samestat(st, st2):
            return path
    return None


def _file_fd(file_obj) -> Optional[int]:
    getter = getattr(file_obj, "fileno", None)
    if not callable(getter):
        return None
    try:
        fd = getter()
    except (io.UnsupportedOperation, OSError, ValueError, AttributeError):
        return None
    if not isinstance(fd, int) or fd < 0:
        return None
    return fd


class _AnonymousFile:
    """An anonymous in-memory file (memfd) reachable through a path."""

    def __init__(self, name: str):
        self._tmp = None
        fd = None
        if hasattr(os, "memfd_create"):
            try:
                fd = os.memfd_create(name, getattr(os, "MFD_CLOEXEC", 0))
            except OSError:
                fd = None
        path = _proc_fd_path(fd) if fd is not None else None
        if path is None:
            if fd is not None:
                os.close(fd)
            self._tmp = tempfile.NamedTemporaryFile(
                prefix=name + "-", delete=True
            )
            fd = self._tmp.fileno()
            path = self._tmp.name
        self.fd: Optional[int] = fd
        self.path: str = path

    def close(self):
        if self._tmp is not None:
            self._tmp.close()
            self._tmp = None
            self.fd = None
        elif self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)

    def write_all(self, data, offset: int) -> None:
        with memoryview(data) as raw, raw.cast("B") as mv:
            done = 0
            total = mv.nbytes
            while done < total:
                with mv[done : done + (1 << 30)] as part:
                    n = os.pwrite(self.fd, part, offset + done)
                if n <= 0:
                    raise OSError("Failed to write to an anonymous file")
                done += n

    def release(self, ranges: Iterable[Tuple[int, int]]) -> bool:
        """
        Free the memory behind byte ranges ``(offset, length)`` by punching
        holes (they then read as zeros). Best effort; returns success.
        """
        if not _syscalls.has_fallocate() or self.fd is None:
            return False
        mode = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        try:
            for offset, length in ranges:
                if length > 0:
                    _syscalls.fallocate(self.fd, mode, offset, length)
        except OSError:
            return False
        return True

    def read_into_file(self, dst, begin: int, end: int, dst_base: int) -> None:
        """Copy bytes [begin, end) to file object `dst` at dst_base + begin."""
        if end <= begin:
            return
        with mmap.mmap(self.fd, end, access=mmap.ACCESS_READ) as mm:
            with memoryview(mm) as mv:
                dst.seek(dst_base + begin)
                pos = begin
                while pos < end:
                    n = dst.write(mv[pos:end])
                    if n is None or n <= 0:
                        raise OSError("Failed to write to file object")
                    pos += n

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _native_key_of(encryption, expected: type):
    """The native key handle of an `encryption=` argument (None for None)."""
    if encryption is None:
        return None
    if not isinstance(encryption, expected):
        raise TypeError(
            f"encryption parameter: expected {expected.__name__} instance"
            f" or None, {encryption.__class__.__name__} found"
        )
    return encryption._native_key()


class _Options:
    """Owns a tz_options handle."""

    def __init__(self, values: Dict[str, str], key=None):
        self.ptr = ffi.NULL
        if not values and key is None:
            return
        lib = _native.lib
        out = ffi.new("tz_options **")
        _native.check(lib.tz_options_new(out))
        self.ptr = out[0]
        for k, v in values.items():
            rc = lib.tz_options_set(self.ptr, k.encode(), str(v).encode())
            if rc != 0:
                msg = _native.error_message()
                self.free()
                _native.raise_error(rc, msg)
        if key is not None:
            # The options take their own reference to the key handle.
            rc = lib.tz_options_set_key(self.ptr, key.ptr)
            if rc != 0:
                msg = _native.error_message()
                self.free()
                _native.raise_error(rc, msg)

    def free(self):
        if self.ptr != ffi.NULL:
            _native.lib.tz_options_free(self.ptr)
            self.ptr = ffi.NULL


def _open_error(rc: int, path: str) -> BaseException:
    msg = _native.error_message()
    if rc == _native.lib.TZ_E_NOT_FOUND:
        if stream_io.http_url(path) is not None:
            return FileNotFoundError(msg)  # the message names the URL without its query
        e = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        return e
    try:
        _native.raise_error(rc, msg)
    except BaseException as e:  # noqa: B902 - converted, then returned
        return e
    raise AssertionError("unreachable")


def _resolve_device_by_context() -> Optional[torch.device]:
    try:
        get_mode = torch.overrides._get_current_function_mode
        mode = get_mode()
        if mode is not None:
            device = getattr(mode, "device", None)
            return torch.device(device) if device is not None else None
        return None
    except (TypeError, AttributeError):
        return _torch_empty(0).device


def _resolve_cuda_device() -> torch.device:
    local = _resolve_device_by_context()
    if local is not None and local.type == "cuda" and local.index is not None:
        return local
    if torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cuda", 0)


# ----------------------------------------------------------------------------
# Deserializer
# ----------------------------------------------------------------------------


class _Entry:
    """One tensor of the file, as the reader's metadata index describes it."""

    __slots__ = (
        "index",
        "path",
        "name",
        "tensor_type",
        "dtype",
        "shape",
        "offset",
        "data_offset",
        "data_length",
        "nbytes",
        "itemsize",
        "is_meta",
        "is_opaque",
        "position",
        "_decoded",
    )

    @property
    def decoded(self) -> _dtypes.DecodedDType:
        d = self._decoded
        if d is None:
            d = self._decoded = _dtypes.decode_dtype(self.dtype)
        return d

    def to_tensor_entry(self) -> TensorEntry:
        long = any(d >= (1 << 32) for d in self.shape)
        return TensorEntry(
            metadata_version=(
                LONG_TENSOR_TENSORIZER_VERSION
                if long
                else NON_OPAQUE_TENSORIZER_VERSION
            ),
            name=self.path,
            type=self.tensor_type,
            dtype=self.dtype,
            shape=self.shape,
            offset=self.offset,
            data_offset=self.data_offset,
            data_length=self.data_length,
            hashes=None,
            header_hashes=None,
        )


def _read_entries(reader, count: int) -> List[_Entry]:
    """The metadata index of an open tz_reader, one _Entry per tensor."""
    lib = _native.lib
    tinfo = ffi.new("tz_tensor_info *", {"version": lib.TZ_TENSOR_INFO_VERSION})
    entries: List[_Entry] = []
    unpack = ffi.unpack
    tensor_info = lib.tz_reader_tensor_info
    check = _native.check
    types_ = _TENSOR_TYPES
    for i in range(count):
        check(tensor_info(tinfo, reader, i))
        e = _Entry()
        e.index = i
        n_comps = tinfo.path_len
        p = tinfo.path
        if n_comps == 1 and not p[0].is_index:
            c = p[0]
            name = unpack(c.str, c.str_len).decode("utf-8") if c.str_len else ""
            e.path = (name,)
            e.name = name
        else:
            comps = []
            for j in range(n_comps):
                c = p[j]
                if c.is_index:
                    comps.append(int(c.index))
                else:
                    comps.append(
                        unpack(c.str, c.str_len).decode("utf-8")
                        if c.str_len
                        else ""
                    )
            e.path = e.name = tuple(comps)
        tt = tinfo.tensor_type
        if not 0 <= tt < len(types_):
            raise ValueError(f"{tt} is not a valid TensorType")
        e.tensor_type = types_[tt]
        e.dtype = unpack(tinfo.dtype, tinfo.dtype_len).decode("utf-8")
        ndim = tinfo.ndim
        e.shape = tuple(unpack(tinfo.shape, ndim)) if ndim else ()
        e.offset = tinfo.header_offset
        e.data_offset = tinfo.data_offset
        e.data_length = tinfo.data_length
        e.nbytes = tinfo.nbytes
        e.itemsize = tinfo.itemsize
        e.is_meta = bool(tinfo.is_meta)
        e.is_opaque = bool(tinfo.is_opaque)
        e._decoded = None
        entries.append(e)
    return entries


class _Loaded:
    __slots__ = ("entry", "module_index", "parameter", "raw")

    def __init__(self, entry, module_index, parameter, raw):
        self.entry = entry
        self.module_index = module_index
        self.parameter = parameter
        # The stored data as a CPU tensor: None when it is parameter.data
        # itself, False when not kept (re-read from the file on demand)
        self.raw = raw


class TensorDeserializer(
    collections.abc.Mapping, contextlib.AbstractContextManager
):
    """
    Reads tensors from a tensorizer file, as a read-only mapping
    (a state_dict) or into a ``torch.nn.Module``.

    Args:
        file_obj: A path (str, bytes or os.PathLike) or a readable binary
            file object (e.g. an open file or ``io.BytesIO``).
        device: Where to put the tensors. None: CUDA if available, else CPU.
        filter_func: ``(name) -> bool`` selecting the tensors to make
            available. Names are a ``str`` for plain names, else a ``tuple``
            of path components.
        dtype: If given, cast every loaded tensor (except bool ones) to it.
        lazy_load: If False (the default), load everything now; otherwise
            load tensors on first access.
        plaid_mode, plaid_mode_buffers: Ignored (backwards compatibility).
        num_readers: Threads used for reading. None picks automatically.
        verify_hash: Default for verifying each tensor's stored hashes on
            load (``HashMismatchError`` on mismatch).
        encryption: ``DecryptionParams`` for an encrypted file, or None.
    """

    def __init__(
        self,
        file_obj: "_FileLike",
        device: Optional[Union[torch.device, str]] = None,
        filter_func: Optional[FilterFuncType] = None,
        dtype: Optional[torch.dtype] = None,
        *,
        lazy_load: bool = False,
        plaid_mode: Optional[bool] = None,  # noqa: ARG002 - no effect
        plaid_mode_buffers: Optional[int] = None,  # noqa: ARG002 - no effect
        num_readers: Optional[int] = None,
        verify_hash: bool = False,
        encryption: Optional[DecryptionParams] = None,
    ):
        # Set first, so that close()/__del__ work whatever fails below
        self._reader = ffi.NULL
        self._anon: Optional[_AnonymousFile] = None
        self._file = None  # caller's file object, or None
        self._closed = False
        self._lock = threading.RLock()
        self._cache: Dict[tuple, _Loaded] = {}
        self._entries: List[_Entry] = []
        self._structure: dict = {}
        self._last_yielded: int = -1
        self._bytes_read_hint: int = 0
        self._eager_loaded = False
        self._remote = False
        self.total_compressed_tensor_bytes = 0
        self.read_bytes = 0

        try:
            with _gc_paused():
                self._init(
                    file_obj,
                    device,
                    filter_func,
                    dtype,
                    lazy_load,
                    num_readers,
                    verify_hash,
                    encryption,
                )
        except BaseException:
            self.close()
            raise

    def _init(
        self,
        file_obj,
        device,
        filter_func,
        dtype,
        lazy_load,
        num_readers,
        verify_hash,
        encryption,
    ):
        # Device
        device = utils.get_device() if device is None else torch.device(device)
        is_cuda = device.type == "cuda"
        if is_cuda and not torch.cuda.is_available():
            raise RuntimeError(
                "Cannot deserialize to CUDA device"
                " because CUDA is not available"
            )
        underspecified = is_cuda and device.index is None
        if underspecified:
            device = _resolve_cuda_device()
        self._device: torch.device = device
        self._device_is_dynamic = underspecified and lazy_load

        self._verify_hash = bool(verify_hash)
        key = _native_key_of(encryption, DecryptionParams)
        self._encrypted = encryption is not None
        self._dtype: Optional[torch.dtype] = dtype
        self._lazy_load = bool(lazy_load)

        if num_readers is not None and (
            not isinstance(num_readers, int) or isinstance(num_readers, bool)
        ):
            raise TypeError(
                "num_readers: expected int or None,"
                f" got {num_readers.__class__.__name__}"
            )
        if num_readers is not None and num_readers < 1:
            raise ValueError("num_readers must be positive")

        # Source
        self._source_options: Optional[Dict[str, str]] = None
        path, reopenable = self._open_source(file_obj)
        self._remote = stream_io.http_url(path) is not None

        lib = _native.lib
        out = ffi.new("tz_reader **")
        # Opt-in transparent huge pages for destinations (see tensorizer.h).
        huge_pages = os.environ.get("TENSORIZER_HUGE_PAGES", "0") == "1"
        values = {"huge_pages": "1"} if huge_pages else {}
        source_values = dict(self._source_options or stream_io.http_options(path))
        values.update(source_values)
        # Kept for to_redis, which copies raw byte ranges of the same source.
        self._source_uri, self._source_values = path, source_values
        options = _Options(values, key=key)
        try:
            rc = lib.tz_reader_open(
                out, path.encode("utf-8", "surrogateescape"), options.ptr
            )
        finally:
            options.free()
        if rc != 0:
            raise _open_error(rc, path)
        self._reader = out[0]

        info = ffi.new("tz_file_info *", {"version": lib.TZ_FILE_INFO_VERSION})
        _native.check(lib.tz_reader_file_info(info, self._reader))
        self._data_version = int(info.data_version)
        self._file_flags = _FileFeatureFlags(int(info.flags))  # upstream: an IntFlag
        self._tensor_data_size = int(info.tensor_data_size)
        self._metadata_length = int(info.metadata_length)
        self._file_size = int(info.file_size)
        self._tensors_begin = 73 + self._metadata_length
        self._bytes_read_hint = self._tensors_begin

        # Metadata index
        count_p = ffi.new("uint64_t *")
        _native.check(lib.tz_reader_tensor_count(count_p, self._reader))
        count = int(count_p[0])
        self._file_header = _FileHeader(
            self._data_version, self._file_flags, self._tensor_data_size, count
        )
        entries = _read_entries(self._reader, count)

        if filter_func is not None:
            entries = [e for e in entries if filter_func(e.name)]
        for pos, e in enumerate(entries):
            e.position = pos
        self._entries = entries
        self._by_path: Dict[tuple, _Entry] = {e.path: e for e in entries}
        self._structure = _tensor_path.build_structure(e.path for e in entries)

        # Readers
        if num_readers is not None and num_readers > max(len(entries), 1):
            num_readers = max(len(entries), 1)
        if num_readers is not None and num_readers > 1 and not reopenable:
            raise ValueError(
                "Cannot reopen this type of file to enable parallel"
                " reading with num_readers > 1. File paths, URIs,"
                " and HTTP(S) or S3 streams returned from"
                " tensorizer.stream_io.open_stream, plus some"
                " open files are capable of being reopened."
                " Other file-like objects and special files"
                " (e.g. BytesIO, pipes, sockets) are not supported."
            )
        self._num_readers = num_readers
        self._num_threads = num_readers or 0

        self.total_tensor_bytes = sum(e.nbytes for e in entries)

        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                f"Deserializing {self.total_tensor_bytes} bytes from"
                f" {len(entries)} tensor{'s' * (len(entries) != 1)} using"
                f" lazy_load={self._lazy_load},"
                f" verify_hash={self._verify_hash},"
                f" device={self._device}, dtype={self._dtype},"
                f" data_version={self._data_version}"
            )

        if not self._lazy_load:
            self._generate_state_dict()

    def _open_source(self, file_obj) -> Tuple[str, bool]:
        """Find a path the native reader can open; returns (path, reopenable)."""
        remote = file_obj.raw if isinstance(file_obj, io.BufferedReader) else file_obj
        if isinstance(remote, stream_io.RemoteStreamFile) and file_obj.tell() == 0:
            # A stream from open_stream(url): read the URL natively, with its options.
            self._source_options = remote._tz_options
            return remote._tz_uri, True
        if isinstance(file_obj, (str, bytes, os.PathLike)):
            url = stream_io.http_url(file_obj)
            if url is not None:
                # The native reader fetches byte ranges itself, on num_readers connections.
                return url, True
            path = stream_io.local_path(file_obj)
            if path is None:
                # Remote schemes: let stream_io raise its error
                stream_io.open_stream(file_obj, "rb")
                raise ValueError(f"Cannot open {file_obj!r}")
            if os.path.isdir(path):
                raise IsADirectoryError(
                    errno.EISDIR, os.strerror(errno.EISDIR), path
                )
            return path, True
        if isinstance(file_obj, int) and not isinstance(file_obj, bool):
            path = _proc_fd_path(file_obj)
            if path is None:
                raise ValueError(
                    f"File descriptor {file_obj} does not refer to a regular file"
                )
            return path, True

        self._mode_check(file_obj)
        self._file = file_obj
        fd = _file_fd(file_obj)
        if fd is not None:
            path = _proc_fd_path(fd)
            if path is not None:
                try:
                    pos = file_obj.tell()
                except (OSError, AttributeError, ValueError):
                    pos = 0
                if pos == 0:
                    if _safe_call(file_obj, "writable"):
                        file_obj.flush()
                    return path, True
        # Anything else (BytesIO, pipes, sockets, custom streams):
        # copy its remaining contents into an anonymous in-memory file.
        anon = _AnonymousFile("tensorizer-source")
        self._anon = anon
        offset = 0
        getbuffer = getattr(file_obj, "getbuffer", None)
        if isinstance(file_obj, io.BytesIO) and callable(getbuffer):
            pos = file_obj.tell()
            with file_obj.getbuffer() as buf:
                with buf[pos:] as mv:
                    anon.write_all(mv, 0)
                    offset = mv.nbytes
            file_obj.seek(pos + offset)
        else:
            chunk = bytearray(16 << 20)
            with memoryview(chunk) as mv:
                readinto = getattr(file_obj, "readinto", None)
                while True:
                    if callable(readinto):
                        n = readinto(mv)
                    else:
                        data = file_obj.read(len(chunk))
                        n = len(data) if data else 0
                        mv[:n] = data[:n] if n else b""
                    if not n:
                        break
                    anon.write_all(mv[:n], offset)
                    offset += n
        return anon.path, False

    @staticmethod
    def _mode_check(file_obj) -> None:
        _check_file_mode(file_obj, "TensorDeserializer", "readable", "rb", write=False)

    # -- lifecycle -----------------------------------------------------------

    def _close_source_file(self) -> None:
        """Close the caller's file object (as upstream does after loading)."""
        f, self._file = self._file, None
        if f is not None:
            try:
                f.close()
            except Exception:
                logger.debug("Error closing source file", exc_info=True)

    def close(self) -> None:
        """Release the native reader and close the source."""
        lock = getattr(self, "_lock", None)
        with lock if lock is not None else contextlib.nullcontext():
            self._closed = True
            reader = getattr(self, "_reader", ffi.NULL)
            self._reader = ffi.NULL
            if reader != ffi.NULL:
                _native.lib.tz_reader_free(reader)
            anon = getattr(self, "_anon", None)
            self._anon = None
            if anon is not None:
                anon.close()
            if getattr(self, "_file", None) is not None:
                self._close_source_file()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __exit__(self, exc_type, exc_val, traceback):
        self.close()

    @property
    def _metadata(self) -> Dict[tuple, TensorEntry]:
        """The metadata index of the selected tensors, keyed by path."""
        return {e.path: e.to_tensor_entry() for e in self._entries}

    @property
    def total_file_bytes(self) -> int:
        """The header's tensor_size: data bytes the writer stored."""
        return self._tensor_data_size

    @total_file_bytes.setter
    def total_file_bytes(self, value: int) -> None:
        self._tensor_data_size = value

    @property
    def total_bytes_read(self) -> int:
        # From http(s), s3 and redis, upstream counts what its stream fetched
        # (header, metadata and the tensors read so far), closed or not; we
        # track the same extent. Local files: the tensors' bytes once all are
        # in, as upstream.
        if self._remote:
            return self._bytes_read_hint
        if self._closed or self._eager_loaded:
            return self.total_tensor_bytes
        return self._bytes_read_hint

    @property
    def cache_status(self) -> Optional[str]:
        return None

    # -- loading -------------------------------------------------------------

    def _require_open(self) -> None:
        if self._reader == ffi.NULL:
            raise ValueError(
                "I/O operation on closed file: this TensorDeserializer is"
                " closed; instantiate a new one to load again"
            )

    def _read_flags(self, verify_hash: bool) -> int:
        lib = _native.lib
        return lib.TZ_READ_VERIFY_HASH if verify_hash else lib.TZ_READ_NO_VERIFY_HASH

    def _read_batch(self, requests, count: int, verify_hash: bool) -> None:
        if count == 0:
            return
        failed = ffi.new("size_t *")
        stats = _perf_stats
        start = time.perf_counter_ns() if stats is not None else 0
        rc = _native.lib.tz_reader_read_batch(
            self._reader,
            requests,
            count,
            self._read_flags(verify_hash),
            self._num_threads,
            failed,
        )
        if rc != 0:
            _native.raise_error(rc)
        if stats is not None:
            stats.add(
                file_readinto_ns=time.perf_counter_ns() - start,
                file_readinto_bytes=sum(requests[i].dst_size for i in range(count)),
            )

    def _to_parameter(self, tensor: torch.Tensor) -> torch.nn.Parameter:
        dtype = tensor.dtype
        if self._dtype is not None and dtype != torch.bool and dtype != self._dtype:
            target = self._dtype
        else:
            target = None
        # requires_grad follows the stored dtype, before any cast
        gradient = dtype.is_complex or dtype.is_floating_point
        if target is not None or tensor.device != self._device:
            stats = _perf_stats
            moves = stats is not None and tensor.device != self._device
            start = time.perf_counter_ns() if moves else 0
            tensor = tensor.to(device=self._device, dtype=target)
            if moves:
                stats.add(
                    tensor_to_device_ns=time.perf_counter_ns() - start,
                    tensor_to_device_bytes=tensor.untyped_storage().nbytes(),
                )
        return _Parameter(tensor, requires_grad=gradient)

    def _allocate_cpu(self, e: _Entry) -> torch.Tensor:
        d = e.decoded
        if d.itemsize * _numel(e.shape) != e.nbytes:
            raise ValueError(
                f"Tensor {e.name!r}: dtype {e.dtype!r} and shape {e.shape}"
                f" do not match its size ({e.nbytes} bytes)"
            )
        return _empty_like_entry(e, "cpu")

    def _read_raw_cpu(
        self, entries: Sequence[_Entry], verify_hash: bool
    ) -> List[torch.Tensor]:
        """Read entries into new CPU tensors with one batch call."""
        tensors = [self._allocate_cpu(e) for e in entries]
        n = len(entries)
        reqs = ffi.new("tz_read_request[]", n)
        version = _native.lib.TZ_READ_REQUEST_VERSION
        for i, (e, t) in enumerate(zip(entries, tensors)):
            r = reqs[i]
            r.version = version
            r.index = e.index
            if e.nbytes:
                r.dst = ffi.cast(_VOID_P, t.data_ptr())
            else:
                r.dst = _EMPTY_PTR
            r.dst_size = e.nbytes
        # (the library converts non-native byte orders to host order)
        self._read_batch(reqs, n, verify_hash)
        return tensors

    def _load_uncached(self, entries: List[_Entry], verify_hash: bool) -> None:
        self._require_open()
        if self._device_is_dynamic:
            self._device = _resolve_cuda_device()
        if self._device.type == "cuda":
            loaded = self._load_cuda(entries, verify_hash)
        else:
            raws = self._read_raw_cpu(entries, verify_hash)
            to_parameter = self._to_parameter
            loaded = []
            for e, raw in zip(entries, raws):
                param = to_parameter(raw)
                # raw None: the parameter holds the stored data itself
                shares = param.dtype == raw.dtype and param.device.type == "cpu"
                loaded.append((e, param, None if shares else False))
        if verify_hash and TensorHash is not _TensorHash:
            self._check_with_replaced_tensor_hash(entries)
        info = ffi.new("tz_tensor_info *", {"version": _native.lib.TZ_TENSOR_INFO_VERSION})
        tensor_info = _native.lib.tz_reader_tensor_info
        reader = self._reader
        cache = self._cache
        hint = self._bytes_read_hint
        for e, param, raw in loaded:
            rc = tensor_info(info, reader, e.index)
            if rc != 0:
                _native.raise_error(rc)
            cache[e.path] = _Loaded(e, info.module_index, param, raw)
            end = e.data_offset + e.data_length
            if end > hint:
                hint = end
        self._bytes_read_hint = hint

    def _check_with_replaced_tensor_hash(self, entries: Sequence[_Entry]) -> None:
        """Honours a replaced ``serialization.TensorHash``, as upstream does
        by building one from each stored hash and comparing it with the
        data's. The native read has just proved that the data hashes to the
        stored values, so each object the replacement builds from them must
        carry those same bytes."""
        lib = _native.lib
        count = ffi.new("size_t *")
        for e in entries:
            _native.check(lib.tz_reader_tensor_hashes(ffi.NULL, 0, count, self._reader, e.index))
            n = count[0]
            if n == 0:
                continue
            stored = ffi.new("tz_tensor_hash[]", n)
            for k in range(n):
                stored[k].version = lib.TZ_TENSOR_HASH_VERSION
            _native.check(lib.tz_reader_tensor_hashes(stored, n, count, self._reader, e.index))
            for h in stored:
                value = bytes(ffi.buffer(h.value, h.length))
                kind = HashType(h.type)
                made = TensorHash(type=kind, hash=value)
                if bytes(made.hash) != value:
                    raise HashMismatchError(
                        f"Tensor {e.name!r} failed {kind.name} verification:"
                        f" its data hashes to {value.hex()}, expected {bytes(made.hash).hex()}"
                    )

    def _load_cuda(self, entries: List[_Entry], verify_hash: bool):
        device = self._device
        align = _CUDA_STAGING_ALIGN
        sizes = [(e.nbytes + align - 1) // align * align for e in entries]
        largest = max(sizes, default=0)
        total = sum(sizes)
        budget = max(largest, min(total, _CUDA_STAGING_BYTES), align)
        # Pack consecutive entries into groups that fit one staging buffer
        groups: List[List[Tuple[_Entry, int]]] = []
        current: List[Tuple[_Entry, int]] = []
        used = 0
        for e, size in zip(entries, sizes):
            if current and used + size > budget:
                groups.append(current)
                current, used = [], 0
            current.append((e, used))
            used += size
        if current:
            groups.append(current)

        # Reads fill one pinned staging buffer while the host-to-device
        # copies of the previous group (on a side stream) drain the other.
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        buffers: List[Optional[torch.Tensor]] = [None, None]
        events: List[Optional[torch.cuda.Event]] = [None, None]
        copied: List[Tuple[_Entry, torch.Tensor]] = []
        stats = _perf_stats
        # (start, end) events around each group's copies, read when all are done
        timings: List[Tuple[torch.cuda.Event, torch.cuda.Event]] = []
        try:
            for gi, group in enumerate(groups):
                b = gi % 2
                if events[b] is not None:
                    events[b].synchronize()
                if buffers[b] is None:
                    buffers[b] = _torch_empty(
                        (budget,), dtype=torch.uint8, device="cpu", pin_memory=True
                    )
                buf = buffers[b]
                base = buf.data_ptr()
                reqs = ffi.new("tz_read_request[]", len(group))
                for i, (e, off) in enumerate(group):
                    reqs[i].version = _native.lib.TZ_READ_REQUEST_VERSION
                    reqs[i].index = e.index
                    reqs[i].dst = ffi.cast("void *", base + off) if e.nbytes else _EMPTY_PTR
                    reqs[i].dst_size = e.nbytes
                self._read_batch(reqs, len(group), verify_hash)
                if stats is not None:
                    timings.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
                    timings[-1][0].record(stream)
                for e, off in group:
                    d = e.decoded
                    if d.itemsize * _numel(e.shape) != e.nbytes:
                        raise ValueError(
                            f"Tensor {e.name!r}: dtype {e.dtype!r} and shape"
                            f" {e.shape} do not match its size ({e.nbytes} bytes)"
                        )
                    # Allocated on the current stream, filled on the side one
                    dst = _empty_like_entry(e, device)
                    if e.nbytes:
                        # Copy raw bytes: works for every dtype
                        dst_bytes = dst.view(-1).view(torch.uint8)
                        with torch.cuda.stream(stream):
                            dst_bytes.copy_(buf[off : off + e.nbytes], non_blocking=True)
                    copied.append((e, dst))
                if stats is not None:
                    timings[-1][1].record(stream)
                ev = torch.cuda.Event()
                ev.record(stream)
                events[b] = ev
        finally:
            stream.synchronize()
        del buffers
        if stats is not None:
            stats.add(
                tensor_to_device_ns=int(sum(a.elapsed_time(b) for a, b in timings) * 1e6),
                tensor_to_device_bytes=sum(e.nbytes for e, _ in copied),
            )
        # Casting (if any) on the caller's current stream
        return [(e, self._to_parameter(dst), False) for e, dst in copied]

    def _bulk_load(
        self, entries: Sequence[_Entry], verify_hash: Optional[bool] = None
    ) -> Iterator[_Loaded]:
        """Load (or take from the cache) `entries`; yield them in order."""
        if verify_hash is None:
            verify_hash = self._verify_hash
        entries = list(entries)
        if len({e.index for e in entries}) != len(entries):
            raise ValueError("Keys must not have any duplicates")
        with self._lock:
            uncached = [e for e in entries if e.path not in self._cache]
            if uncached:
                uncached.sort(key=lambda e: e.index)
                with _gc_paused():
                    self._load_uncached(uncached, verify_hash)
            items = [self._cache[e.path] for e in entries]
        for item in items:
            self._last_yielded = item.entry.position
            yield item

    def _load_all(self, entries: Sequence[_Entry], verify_hash=None) -> List[_Loaded]:
        return list(self._bulk_load(entries, verify_hash))

    def _generate_state_dict(self) -> None:
        self._load_all(self._entries)
        self.total_tensor_bytes = sum(e.data_length for e in self._entries)
        self._eager_loaded = True
        self._close_source_file()
        if self._anon is not None and all(
            item.raw is None for item in self._cache.values()
        ):
            # Everything is loaded and nothing will be read again except
            # headers (verify_module): free the in-memory copy of the data.
            self._anon.release(
                (e.data_offset, e.data_length) for e in self._entries
            )

    def _raw_cpu(self, item: _Loaded) -> torch.Tensor:
        """The stored data of a loaded tensor as a CPU tensor."""
        if item.raw is None:
            return item.parameter.data
        if item.raw is False:
            self._require_open()
            item.raw = self._read_raw_cpu([item.entry], False)[0]
        return item.raw

    def _entries_from(
        self,
        filter_func: Optional[FilterFuncType],
        num_tensors: int,
    ) -> List[_Entry]:
        if num_tensors < 0 and num_tensors != -1:
            raise ValueError("num_tensors must be -1 or non-negative")
        if num_tensors == 0:
            return []
        selected: Iterable[_Entry] = self._entries[self._last_yielded + 1 :]
        if filter_func is not None:
            selected = (e for e in selected if filter_func(e.name))
        if num_tensors != -1:
            selected = itertools.islice(selected, num_tensors)
        return list(selected)

    def read_tensors(
        self,
        filter_func: Optional[FilterFuncType] = None,
        num_tensors: int = -1,
        verify_hash: Optional[bool] = None,
    ) -> Iterator[Tuple[int, int, Union[str, tuple], torch.Tensor]]:
        """
        Yield ``(module_idx, tensor_type, name, tensor)`` for the tensors
        after the last one any loading method returned, in file order.

        Args:
            filter_func: Selects tensors by name.
            num_tensors: How many to yield (-1: all).
            verify_hash: Verify stored hashes (None: the constructor's choice).
        """
        entries = self._entries_from(filter_func, num_tensors)
        if not entries:
            return
        for item in self._bulk_load(entries, verify_hash):
            e = item.entry
            yield item.module_index, e.tensor_type, e.name, item.parameter

    def read_numpy_arrays(
        self,
        filter_func: Optional[FilterFuncType] = None,
        num_tensors: int = -1,
        allow_raw_data: bool = False,
        verify_hash: Optional[bool] = None,
    ) -> Iterator[
        Tuple[int, int, Union[str, tuple], numpy.ndarray, bool, Optional[str]]
    ]:
        """
        Like `read_tensors`, but yield the stored data as numpy arrays:
        ``(module_idx, tensor_type, name, arr, is_opaque, torch_dtype)``.

        Opaque dtypes (no numpy equivalent, e.g. bfloat16) raise ValueError
        unless `allow_raw_data`, in which case the array holds the raw data
        as a same-width integer type and `torch_dtype` names the real type.
        """
        if self._device.type != "cpu":
            raise RuntimeError(
                "read_numpy_arrays is only valid when deserializing to the CPU"
            )
        entries = self._entries_from(filter_func, num_tensors)
        if not entries:
            return
        for item in self._bulk_load(entries, verify_hash):
            e = item.entry
            d = e.decoded
            raw = self._raw_cpu(item)
            if d.is_opaque:
                int_type = _dtypes._INTERMEDIATE_TYPES[d.itemsize]
                arr = raw.detach().view(int_type).numpy()
                if not allow_raw_data:
                    np_dtype = arr.dtype.str
                    raise ValueError(
                        f"{e.name} has an opaque datatype: "
                        f"(Torch: {d.torch_str}, Numpy: {np_dtype}). "
                        "Set `allow_raw_data=True` to return as a numpy array "
                        f"with a datatype of {np_dtype}"
                    )
                yield item.module_index, e.tensor_type, e.name, arr, True, d.torch_str
            else:
                arr = raw.detach().numpy()
                yield item.module_index, e.tensor_type, e.name, arr, False, None

    def _load_prefixed(
        self,
        prefix: Iterable[Union[str, int]],
        use_dict_proxies: bool,
        strip_prefix: bool = True,
        filter_func: Optional[FilterFuncType] = None,
    ):
        prefix = tuple(prefix)
        n = len(prefix)
        entries = [
            e
            for e in self._entries
            if e.path[:n] == prefix
            and (filter_func is None or filter_func(e.name))
        ]
        if not entries:
            return None
        flat = {item.entry.path: item.parameter for item in self._bulk_load(entries)}
        result = _tensor_path.restructure(flat, use_dict_proxies)
        if strip_prefix:
            for i in range(n):
                if not result:
                    return None
                if isinstance(result, list):
                    result = result[0]
                else:
                    result = result[prefix[i]]
        return result

    def tree(
        self,
        prefix: Optional[Iterable[Union[str, int]]] = None,
        *,
        default: Any = None,
        filter_func: Optional[FilterFuncType] = None,
    ) -> Union[typing.Mapping, Sequence, torch.Tensor, Any]:
        """
        Load a (sub)tree of the stored structure as nested dicts and lists
        (levels with int keys become lists ordered by index), or the leaf
        tensor if `prefix` names one. Returns `default` if nothing matches.
        """
        if prefix is None:
            prefix = ()
        if isinstance(prefix, (str, int)):
            raise TypeError(
                "Invalid prefix: expected sequence,"
                f" got {prefix.__class__.__name__!r}"
                " (for a single-element prefix, use a single-element sequence)"
            )
        result = self._load_prefixed(
            prefix, use_dict_proxies=False, filter_func=filter_func
        )
        return result if result is not None else default

    # -- Mapping interface -----------------------------------------------------

    def __getitem__(self, name) -> Union[torch.nn.Parameter, typing.Mapping]:
        path = (name,)
        cached = self._cache.get(path)
        if cached is not None:
            return cached.parameter
        try:
            branch = self._structure[name]
        except (KeyError, TypeError):
            raise KeyError(f"Tensor {name} not found") from None
        if isinstance(branch, tuple):
            return self._load_all([self._by_path[path]])[0].parameter
        return self._load_prefixed(path, use_dict_proxies=True) or types.MappingProxyType({})

    def __iter__(self):
        return iter(self._structure)

    def __len__(self):
        return len(self._structure)

    def __contains__(self, key):
        try:
            return key in self._structure
        except TypeError:
            return False

    def keys(self):
        return self._structure.keys()

    # -- modules ---------------------------------------------------------------

    def load_into_module(
        self,
        m: torch.nn.Module,
        filter_func: Optional[FilterFuncType] = None,
        verify_hash: Optional[bool] = None,
    ) -> int:
        """
        Register the stored parameters and buffers on `m` and its submodules
        (by name: ``"<module path>.<attr>"``). Returns how many were loaded.
        """
        modules: Dict[str, torch.nn.Module] = dict(m.named_modules())
        entries = [
            e for e in self._entries if filter_func is None or filter_func(e.name)
        ]
        targets = []
        for e in entries:
            if e.tensor_type == TensorType.STATE_DICT:
                raise NotImplementedError(
                    "This was serialized using"
                    " TensorSerializer.write_state_dict(), so it cannot be"
                    " loaded using TensorDeserializer.load_into_module()."
                    " Use the TensorDeserializer object directly as a"
                    " state_dict mapping instead."
                )
            if not isinstance(e.name, str):
                raise NotImplementedError(
                    "Cannot deserialize structured tensor keys as a module;"
                    " try using the TensorDeserializer directly"
                    " as a state_dict mapping instead."
                )
            obj_path, attr = e.name.rsplit(".", 1)
            targets.append((modules[obj_path], attr, e.tensor_type))

        for item, (module, attr, tensor_type) in zip(
            self._bulk_load(entries, verify_hash), targets
        ):
            if tensor_type == TensorType.PARAM:
                module.register_parameter(attr, item.parameter)
            else:
                module.register_buffer(attr, item.parameter)

        self._close_source_file()
        return len(entries)

    def _verify_hashes(
        self,
        name,
        hashes: Iterable[TensorHash],
        header_hashes: Dict[HashType, Any],
        mv,
    ) -> None:
        """
        Checks tensor data `mv` against `hashes` (upstream's helper, for
        callers that hold the stored hashes themselves; loads check hashes
        natively). `header_hashes` maps each hash type to its running value
        over the tensor's header: a CRC32 int, or a hashlib sha256 object
        (copied, not changed). A tensor stored without data (meta) is checked
        as empty. Raises HashMismatchError naming the tensor, or ValueError
        for an unknown hash type.
        """
        entry = self._by_path.get(name) if isinstance(name, tuple) else None
        if entry is None:
            entry = next((e for e in self._entries if e.name == name), None)
        if entry is not None and entry.data_length == 0:
            mv = b""
        for tensor_hash in hashes:
            kind, expected = tensor_hash.type, tensor_hash.hash
            if kind == HashType.CRC32:
                got = zlib.crc32(mv, header_hashes[kind])
                want = int.from_bytes(expected, "little")
                if got != want:
                    raise HashMismatchError(
                        f"Tensor {name!r} failed CRC32 verification. Expected {want}, got {got}."
                    )
            elif kind == HashType.SHA256:
                sha = header_hashes[kind].copy()
                sha.update(mv)
                digest = sha.digest()
                if digest != expected:
                    raise HashMismatchError(
                        f"Tensor {name!r} failed SHA256 verification."
                        f" Expected {bytes(expected).hex()}, got {digest.hex()}."
                    )
            else:
                raise ValueError(f"Tensor {name!r} has an invalid hash type: {kind}")

    def _verify_tensor(self, e: _Entry, tensor) -> bool:
        lib = _native.lib
        if e.data_length == 0:
            ptr, size = ffi.NULL, 0
            keep = None
        else:
            if not isinstance(tensor, torch.Tensor):
                return False
            t = tensor.detach()
            if t.is_meta:
                return False
            if t.device.type != "cpu":
                t = t.to("cpu")
            t = t.resolve_conj().resolve_neg().contiguous()
            size = t.numel() * t.element_size()
            if size != e.data_length:
                return False
            keep = t
            ptr = ffi.cast("void *", t.data_ptr())
        rc = lib.tz_reader_verify_bytes(self._reader, e.index, ptr, size)
        del keep
        if rc == 0:
            return True
        if rc == lib.TZ_E_HASH:
            return False
        _native.raise_error(rc)

    def verify_module(
        self, m: torch.nn.Module
    ) -> Tuple[bool, List[Tuple[Union[str, tuple], bool]]]:
        """
        Check `m`'s tensors against the stored hashes.

        Returns ``(passed, [(name, ok), ...])``; names missing from `m`
        count as failures.
        """
        if self._reader == ffi.NULL:
            raise RuntimeError(
                "verify_module needs an open TensorDeserializer:"
                " call it before close()"
            )
        module_tensors: Dict[str, torch.Tensor] = collections.OrderedDict()
        module_tensors.update(m.state_dict())
        # Non-persistent buffers are serialized too, but not in state_dict()
        module_tensors.update(m.named_buffers())

        results: List[Tuple[Union[str, tuple], bool]] = []
        with self._lock:
            for e in self._entries:
                name = e.name
                if name not in module_tensors:
                    results.append((name, False))
                    continue
                if e.path not in self._cache:
                    # As upstream: hashes are known only for loaded tensors
                    raise RuntimeError(
                        f"No hashes found in metadata for {name}. This is"
                        " usually caused by a TensorDeserializer that was"
                        " instantiated with lazy_load=True, and not loaded"
                        " into a module before calling this."
                    )
                results.append((name, self._verify_tensor(e, module_tensors[name])))
        for key in self.keys():
            if key not in module_tensors:
                results.append((key, False))
        return all(ok for _, ok in results), results

    def to_redis(self, redis_client, key_prefix: str, force: bool = False) -> None:
        """
        Writes this file to Redis in upstream's layout, so that
        ``TensorDeserializer("redis://host:port/<key_prefix>")`` (ours or
        upstream's) reads it back: ``{key_prefix}:header:0`` holds the file
        header and metadata index, and each tensor (after ``filter_func``)
        has ``{key_prefix}:{name}:{offset}`` keys for its header and its data
        (still encrypted if the file is). Zero-length data gets no key (an
        empty key would make readers misplace the next record). With
        ``force=False``, tensors whose header key exists are skipped.

        Args:
            redis_client: A ``redis.Redis`` client (anything with ``set``,
                ``exists`` and ``pipeline``).
            key_prefix: The prefix of every key.
            force: Overwrite existing keys.
        """
        self._require_open()
        source = stream_io.RemoteStreamFile(self._source_uri, self._source_values)
        try:
            def read(offset: int, length: int) -> bytes:
                source.seek(offset)
                data = source.read(length)
                if len(data) != length:
                    raise ValueError(f"Short read at {offset}: {len(data)} of {length} bytes")
                return data

            pipe = redis_client.pipeline(transaction=False)
            pending = 0
            pipe.set(f"{key_prefix}:header:0", read(0, self._tensors_begin))
            for e in self._entries:
                name = _tensor_path.encode_path(e.path).decode("utf-8")
                header_key = f"{key_prefix}:{name}:{e.offset}"
                if not force and redis_client.exists(header_key):
                    continue
                pipe.set(header_key, read(e.offset, e.data_offset - e.offset))
                if e.data_length:
                    pipe.set(f"{key_prefix}:{name}:{e.data_offset}", read(e.data_offset, e.data_length))
                pending += e.data_length
                if pending >= 256 << 20:  # bound the memory held by the pipeline
                    pipe.execute()
                    pending = 0
            pipe.execute()
        finally:
            source.close()


def _safe_call(obj, name: str) -> bool:
    fn = getattr(obj, name, None)
    if not callable(fn):
        return False
    try:
        return bool(fn())
    except Exception:
        return False


# ----------------------------------------------------------------------------
# Serializer
# ----------------------------------------------------------------------------


class _WriteSpec(typing.NamedTuple):
    idx: int
    path: Union[str, tuple]
    tensor_type: TensorType
    tensor: Any


class TensorSerializer:
    """
    Writes tensors to a tensorizer file.

    Args:
        file_obj: A path (str, bytes or os.PathLike; parent directories are
            created) or a readable, writable, seekable binary file object
            (e.g. an open file or ``io.BytesIO``).
        compress_tensors: Has no effect.
        encryption: ``EncryptionParams`` to encrypt every tensor's data, or
            None.
        limit_cpu_concurrency: Maximum worker threads for hashing and
            writing (None: one per CPU).
    """

    def __init__(
        self,
        file_obj: "_FileLike",
        compress_tensors: bool = False,
        *,
        encryption: Optional[EncryptionParams] = None,
        limit_cpu_concurrency: Optional[int] = None,
    ) -> None:
        self._writer = ffi.NULL
        self._file = None  # caller's (or our) file object to close at the end
        self._mirror: Optional[_AnonymousFile] = None
        self._mirror_base = 0
        self._mirror_synced = 0
        self._closed = False
        self._state = (NON_OPAQUE_TENSORIZER_VERSION, 0, 0, 0)
        self.compress_tensors = compress_tensors
        self.total_compressed_tensor_bytes = 0

        if limit_cpu_concurrency is not None:
            if not isinstance(limit_cpu_concurrency, int) or isinstance(
                limit_cpu_concurrency, bool
            ):
                raise TypeError(
                    "limit_cpu_concurrency parameter: expected int or None,"
                    f" {limit_cpu_concurrency.__class__.__name__} found"
                )
            if limit_cpu_concurrency < 1:
                raise ValueError(
                    "limit_cpu_concurrency parameter: must be positive"
                    f" (or None for unbound), got {limit_cpu_concurrency}"
                )
        self._num_threads = limit_cpu_concurrency or 0
        self.cpu_limit = limit_cpu_concurrency or (os.cpu_count() or 1)

        key = _native_key_of(encryption, EncryptionParams)
        self._encrypted = encryption is not None

        try:
            path = self._open_target(file_obj)
            out = ffi.new("tz_writer **")
            options = _Options(getattr(self, "_target_options", None) or {}, key=key)
            try:
                rc = _native.lib.tz_writer_open(
                    out, path.encode("utf-8", "surrogateescape"), options.ptr
                )
            finally:
                options.free()
            if rc != 0:
                raise _open_error(rc, path)
            self._writer = out[0]
            self._refresh_state()
            self._sync_mirror()
        except BaseException:
            self._release(close_file=False)
            raise

    def _open_target(self, file_obj) -> str:
        if isinstance(file_obj, stream_io.RemoteWriteStream) and file_obj.tell() == 0:
            # From open_stream("s3://...", "wb"): write the URI natively with its options.
            self._target_options = file_obj._tz_options
            return file_obj._tz_uri
        if isinstance(file_obj, (str, bytes)):
            url = stream_io.http_url(file_obj)
            if url is not None and url.lower().startswith("s3://"):
                # Streamed into a multipart upload by the native writer.
                self._target_options = stream_io.http_options(url, for_write=True)
                return url
        if isinstance(file_obj, (str, bytes, os.PathLike)):
            path = stream_io.local_path(file_obj)
            if path is None:
                stream_io.open_stream(file_obj, "wb+")
                raise ValueError(f"Cannot open {file_obj!r} for writing")
            dirname = os.path.dirname(path)
            if dirname:
                os.makedirs(dirname, exist_ok=True)
            return path
        if isinstance(file_obj, int) and not isinstance(file_obj, bool):
            path = _proc_fd_path(file_obj)
            if path is None:
                raise ValueError(
                    f"File descriptor {file_obj} does not refer to a regular file"
                )
            return path

        self._mode_check(file_obj)
        seekable = getattr(file_obj, "seekable", None)
        if callable(seekable) and not seekable():
            raise ValueError("file_obj must support seeking for serialization")
        self._file = file_obj
        try:
            start = file_obj.tell()
        except (OSError, AttributeError, ValueError):
            start = 0
        fd = _file_fd(file_obj)
        if fd is not None and start == 0:
            path = _proc_fd_path(fd)
            if path is not None:
                if callable(getattr(file_obj, "flush", None)):
                    file_obj.flush()
                return path
        # Write to an anonymous file, and mirror each completed write call
        # into the file object.
        self._mirror = _AnonymousFile("tensorizer-target")
        self._mirror_base = start
        return self._mirror.path

    @staticmethod
    def _mode_check(file_obj) -> None:
        _check_file_mode(
            file_obj, "TensorSerializer", "readable, writable,", "wb+", write=True
        )

    # -- state -------------------------------------------------------------

    def _refresh_state(self) -> None:
        st = ffi.new("tz_writer_state *", {"version": _native.lib.TZ_WRITER_STATE_VERSION})
        _native.check(_native.lib.tz_writer_state_get(st, self._writer))
        self._state = (
            int(st.data_version),
            int(st.tensor_count),
            int(st.tensor_data_size),
            int(st.file_size),
        )

    @property
    def total_tensor_bytes(self) -> int:
        return self._state[2]

    def _sync_mirror(self) -> None:
        """Copy what the last write call changed into the caller's file object."""
        mirror = self._mirror
        if mirror is None:
            return
        size = os.fstat(mirror.fd).st_size
        if size <= 0:
            return
        dst, base = self._file, self._mirror_base
        synced = self._mirror_synced
        if synced == 0 or size < 73:
            mirror.read_into_file(dst, 0, size, base)
        else:
            # Changed since the last sync: the file header and metadata
            # block, the old end marker, and everything after it.
            m_len = struct.unpack("<Q", os.pread(mirror.fd, 8, 65))[0]
            head_end = min(73 + m_len, size)
            mirror.read_into_file(dst, 0, head_end, base)
            tail = max(head_end, min(synced - 8, size))
            mirror.read_into_file(dst, tail, size, base)
        self._mirror_synced = size
        if callable(getattr(dst, "flush", None)):
            dst.flush()
        end_marker = self._state[3] - 8
        if end_marker > 0:
            dst.seek(base + end_marker)

    def _check_open(self) -> None:
        if self._closed or self._writer == ffi.NULL:
            raise ValueError("I/O operation on closed file.")

    def close(self) -> None:
        """Finalize the file (header, end marker) and close it."""
        if self._closed:
            return
        try:
            if self._writer != ffi.NULL:
                _native.check(_native.lib.tz_writer_close(self._writer))
                self._refresh_state()
                self._sync_mirror()
        finally:
            self._release(close_file=True)
        logger.debug(f"Tensors completed serializing to {self._state[3]} bytes")

    def _release(self, close_file: bool) -> None:
        self._closed = True
        writer = getattr(self, "_writer", ffi.NULL)
        self._writer = ffi.NULL
        if writer != ffi.NULL:
            _native.lib.tz_writer_free(writer)
        mirror = getattr(self, "_mirror", None)
        self._mirror = None
        if mirror is not None:
            mirror.close()
        f = getattr(self, "_file", None)
        self._file = None
        if close_file and f is not None:
            f.close()

    def __del__(self):
        try:
            self._release(close_file=True)
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_val, tb):
        self.close()

    # -- writing -----------------------------------------------------------

    def _write(self, data, expected_bytes_written: Optional[int] = None) -> int:
        """
        Writes `data` (any buffer) to the caller's file object at its current
        position, calling ``write`` again after short writes until all of it,
        or `expected_bytes_written` bytes, went out or a call wrote nothing
        (upstream's low-level helper; not thread-safe). Returns the bytes
        written. ValueError if one call claims more than expected;
        io.UnsupportedOperation when the target is a path or URI, which only
        the native writer writes.
        """
        if self._file is None:
            raise io.UnsupportedOperation(
                "TensorSerializer._write needs a file object target; paths and"
                " URIs are written by libtensorizer"
            )
        with memoryview(data) as raw, raw.cast("B") as mv:
            if expected_bytes_written is None:
                expected_bytes_written = mv.nbytes
            written = self._file.write(mv)
            if written > expected_bytes_written:
                raise ValueError("Wrote more data than expected")
            last = written
            while written < expected_bytes_written and last:
                with mv[written:] as rest:
                    last = self._file.write(rest)
                written += last
        return written

    @staticmethod
    def _name_bytes(path: Union[str, tuple]) -> bytes:
        if isinstance(path, str):
            if not path:
                raise ValueError(
                    "Invalid tensor name: the empty string cannot be"
                    " deserialized"
                )
            if path.startswith("\x1e"):
                raise ValueError(
                    f"Invalid tensor name {path!r}: names beginning with"
                    " '\\x1e' are reserved for structured tensor paths"
                )
            return path.encode("utf-8")
        if isinstance(path, (tuple, list)):
            path = tuple(path)
            _tensor_path.validate_path(path)
            if len(path) == 1 and isinstance(path[0], str):
                return TensorSerializer._name_bytes(path[0])
            return _tensor_path.encode_path(path)
        raise TypeError(f"Invalid tensor path type: {path.__class__.__name__!r}")

    def _write_specs(self, specs: Sequence[_WriteSpec]) -> None:
        with _gc_paused():
            self._write_specs_impl(specs)

    def _write_specs_impl(self, specs: Sequence[_WriteSpec]) -> None:
        self._check_open()
        n = len(specs)
        descs = ffi.new("tz_tensor_desc[]", max(n, 1))
        keep: List[Any] = []  # objects that must outlive the native call
        version = _native.lib.TZ_TENSOR_DESC_VERSION
        for i, (idx, path, tensor_type, tensor) in enumerate(specs):
            d = descs[i]
            d.version = version
            struct.pack("<H", idx)  # struct.error, as upstream, if out of range
            name_bytes = self._name_bytes(path)
            struct.pack("<H", len(name_bytes))
            tensor_type = TensorType(tensor_type)

            if isinstance(tensor, torch.Tensor):
                dtype_str = _dtypes.dtype_string_for_torch(tensor.dtype)
                shape = tuple(tensor.shape)
                if tensor.is_meta:
                    d.is_meta = 1
                    d.data = ffi.NULL
                    d.data_size = 0
                else:
                    t = tensor.detach()
                    if t.device.type != "cpu":
                        t = t.to("cpu")
                    if t.is_conj():
                        t = t.resolve_conj()
                    if t.is_neg():
                        t = t.resolve_neg()
                    if not t.is_contiguous():
                        t = t.contiguous()
                    size = t.numel() * t.element_size()
                    keep.append(t)
                    d.is_meta = 0
                    d.data = ffi.cast(_CONST_VOID_P, t.data_ptr()) if size else _EMPTY_PTR
                    d.data_size = size
            elif isinstance(tensor, numpy.ndarray):
                dtype_str = _dtypes.dtype_string_for_numpy(tensor.dtype)
                arr = tensor
                if not arr.flags.c_contiguous:
                    arr = numpy.ascontiguousarray(arr)
                shape = tuple(arr.shape)
                keep.append(arr)
                d.is_meta = 0
                d.data = (
                    ffi.cast(_CONST_VOID_P, arr.__array_interface__["data"][0])
                    if arr.nbytes
                    else _EMPTY_PTR
                )
                d.data_size = arr.nbytes
            else:
                raise TypeError(
                    "Cannot serialize an object of type"
                    f" {tensor.__class__.__name__!r}: expected a torch.Tensor"
                    " or numpy.ndarray"
                )

            dtype_bytes = dtype_str.encode("utf-8")
            if len(dtype_bytes) >= 256:
                raise ValueError("dtype name length should be less than 256")
            name_buf = ffi.from_buffer(_U8_ARRAY, name_bytes)
            dtype_buf = ffi.from_buffer(_CHAR_ARRAY, dtype_bytes)
            keep.extend((name_buf, dtype_buf))
            d.name = name_buf
            d.name_len = len(name_bytes)
            d.dtype = dtype_buf
            d.dtype_len = len(dtype_bytes)
            d.ndim = len(shape)
            if shape:
                shape_buf = ffi.new(_U64_ARRAY, shape)
                keep.append(shape_buf)
                d.shape = shape_buf
            else:
                d.shape = ffi.NULL
            d.module_index = operator.index(idx)
            d.tensor_type = int(tensor_type)

        rc = _native.lib.tz_writer_write(self._writer, descs, n, self._num_threads)
        err = _native.error_message() if rc != 0 else None
        del keep
        if rc != 0:
            # Keep the caller's file object consistent with what was recorded
            try:
                self._refresh_state()
                self._sync_mirror()
            except Exception:
                pass
            _native.raise_error(rc, err)
        self._refresh_state()
        self._sync_mirror()

    def write_tensor(
        self,
        idx,
        name,
        tensor_type: TensorType,
        tensor: Union[torch.Tensor, numpy.ndarray],
    ) -> None:
        """
        Write one tensor.

        Args:
            idx: The module index stored with the tensor (0-65535).
            name: The tensor's name (a non-empty str), or a sequence of
                path components (str or non-negative int).
            tensor_type: A `TensorType`.
            tensor: A ``torch.Tensor`` (any device; meta tensors are stored
                without data) or a ``numpy.ndarray``.
        """
        self._write_specs([_WriteSpec(idx, name, tensor_type, tensor)])

    def write_module(
        self,
        m: torch.nn.Module,
        remove_tensors: bool = False,
        *,
        include_non_persistent_buffers: bool = True,
    ) -> None:
        """
        Write every parameter and buffer of `m` and its submodules, named
        ``"<module path>.<attr>"`` (root tensors get a leading dot), for
        `TensorDeserializer.load_into_module`.

        Args:
            m: The module.
            remove_tensors: Set each written attribute to None afterwards.
            include_non_persistent_buffers: Also write buffers registered
                with ``persistent=False``.
        """
        with _gc_paused():
            self._write_module(m, remove_tensors, include_non_persistent_buffers)

    def _write_module(
        self, m: torch.nn.Module, remove_tensors: bool, include_non_persistent_buffers: bool
    ) -> None:
        specs: List[_WriteSpec] = []
        removals = []
        for idx, (module_name, module) in enumerate(m.named_modules()):
            non_persistent = (
                getattr(module, "_non_persistent_buffers_set", ())
                if not include_non_persistent_buffers
                else ()
            )
            for name, tensor in module.named_parameters(recurse=False):
                specs.append(
                    _WriteSpec(idx, f"{module_name}.{name}", TensorType.PARAM, tensor)
                )
                if remove_tensors:
                    removals.append((module, name))
            for name, tensor in module.named_buffers(recurse=False):
                if name in non_persistent:
                    continue
                specs.append(
                    _WriteSpec(idx, f"{module_name}.{name}", TensorType.BUFFER, tensor)
                )
                if remove_tensors:
                    removals.append((module, name))
        self._write_specs(specs)
        del specs
        for module, name in removals:
            setattr(module, name, None)

    def write_state_dict(self, state_dict: Union[Dict, List, Tuple]) -> None:
        """
        Write a state dict: a mapping with str keys, a list or tuple, or any
        nesting of those, with ``torch.Tensor`` leaves. Nested positions are
        stored as structured tensor paths; read them back with the
        deserializer's mapping interface or `TensorDeserializer.tree`.
        """
        with _gc_paused():
            self._write_state_dict(state_dict)

    def _write_state_dict(self, state_dict) -> None:
        specs = [
            _WriteSpec(
                0,
                path[0] if len(path) == 1 and isinstance(path[0], str) else path,
                TensorType.STATE_DICT,
                tensor,
            )
            for path, tensor in _tensor_path.flatten_structure(
                torch.Tensor, state_dict
            )
        ]
        self._write_specs(specs)
