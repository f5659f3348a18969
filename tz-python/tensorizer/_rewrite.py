"""
Copies a tensorizer file tensor by tensor through libtensorizer, decrypting
and/or encrypting on the way: how ``python -m tensorizer encrypt|decrypt``
adds or removes encryption without torch and without changing any tensor.

Names, dtypes, shapes, tensor types, module indices and meta tensors are
kept; every tensor is hash-verified as it is read. The output is written to
a temporary file next to the destination and renamed into place only when
complete, so a failure leaves the destination untouched.
"""

import os
from typing import Callable, Optional

from . import _native
from ._crypt import DecryptionParams, EncryptionParams
from ._native import ffi
from ._verify import open_native_reader

__all__ = ["rewrite"]

# Tensors are copied in write calls of about this many bytes (or one tensor,
# if larger), bounding memory while keeping calls few.
_BATCH_BYTES = 512 << 20


def _options(key) -> "ffi.CData":
    lib = _native.lib
    out = ffi.new("tz_options **")
    _native.check(lib.tz_options_new(out))
    opts = ffi.gc(out[0], lib.tz_options_free)
    if key is not None:
        _native.check(lib.tz_options_set_key(opts, key.ptr))
    return opts


def rewrite(
    src: str,
    dst: str,
    *,
    decryption: Optional[DecryptionParams] = None,
    encryption: Optional[EncryptionParams] = None,
    overwrite: bool = False,
    progress: Optional[Callable[[int, int], None]] = None,
) -> int:
    """Copies ``src`` to ``dst``; returns the number of tensors copied.

    ``progress``, if given, is called as ``progress(bytes_done, bytes_total)``
    (tensor data read) before the first batch and after each one."""
    lib = _native.lib
    if os.path.exists(dst) and not overwrite:
        raise FileExistsError(f"{dst} exists (use --force to replace it)")
    reader = open_native_reader(src, decryption)
    count_p = ffi.new("uint64_t *")
    _native.check(lib.tz_reader_tensor_count(count_p, reader))
    count = int(count_p[0])
    _native.check(lib.tz_reader_load_headers(reader, ffi.NULL, 0))
    done_after = _data_offsets(reader, count) if progress is not None else []

    tmp = f"{dst}.tmp-{os.getpid()}"
    write_opts = _options(encryption._native_key() if encryption else None)
    writer_p = ffi.new("tz_writer **")
    _native.check(lib.tz_writer_open(writer_p, os.fsencode(tmp), write_opts))
    writer = writer_p[0]
    try:
        index = 0
        if progress is not None:
            progress(0, done_after[count])
        while index < count:
            index = _copy_batch(reader, writer, index, count)
            if progress is not None:
                progress(done_after[index], done_after[count])
        _native.check(lib.tz_writer_close(writer))
        os.replace(tmp, dst)
    except BaseException:
        # Freed first: freeing an open writer closes it, which would put its
        # file in place at `tmp` after the unlink.
        lib.tz_writer_free(writer)
        writer = None
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    finally:
        if writer is not None:
            lib.tz_writer_free(writer)
    return count


def _data_offsets(reader, count: int) -> list:
    """Bytes of tensor data before each tensor index (and in all, at ``count``)."""
    lib = _native.lib
    info = ffi.new("tz_tensor_info *", {"version": lib.TZ_TENSOR_INFO_VERSION})
    offsets = [0]
    for i in range(count):
        _native.check(lib.tz_reader_tensor_info(info, reader, i))
        offsets.append(offsets[-1] + (0 if info.is_meta else int(info.nbytes)))
    return offsets


def _copy_batch(reader, writer, start: int, count: int) -> int:
    """Reads tensors from ``start`` (at least one) and writes them; returns the next index."""
    lib = _native.lib
    infos, buffers, keep = [], [], []
    total = 0
    index = start
    while index < count and (index == start or total < _BATCH_BYTES):
        info = ffi.new("tz_tensor_info *", {"version": lib.TZ_TENSOR_INFO_VERSION})
        _native.check(lib.tz_reader_tensor_info(info, reader, index))
        size = int(info.nbytes)
        if index > start and total + size > _BATCH_BYTES:
            break
        infos.append((index, info))
        buffers.append(ffi.new("uint8_t[]", max(size, 1)))
        total += size
        index += 1

    requests = ffi.new("tz_read_request[]", len(infos))
    for k, ((i, info), buf) in enumerate(zip(infos, buffers)):
        requests[k].version = lib.TZ_READ_REQUEST_VERSION
        requests[k].index = i
        requests[k].dst = buf
        requests[k].dst_size = int(info.nbytes)
    _native.check(
        lib.tz_reader_read_batch(
            reader, requests, len(infos), lib.TZ_READ_VERIFY_HASH, 0, ffi.NULL
        )
    )

    descs = ffi.new("tz_tensor_desc[]", len(infos))
    for k, ((_, info), buf) in enumerate(zip(infos, buffers)):
        d = descs[k]
        d.version = lib.TZ_TENSOR_DESC_VERSION
        d.name = info.name
        d.name_len = info.name_len
        d.dtype = info.dtype
        d.dtype_len = info.dtype_len
        d.ndim = info.ndim
        d.shape = info.shape
        d.module_index = max(int(info.module_index), 0)
        d.tensor_type = info.tensor_type
        d.is_meta = info.is_meta
        d.data = buf
        d.data_size = 0 if info.is_meta else int(info.nbytes)
        keep.append(buf)
    _native.check(lib.tz_writer_write(writer, descs, len(infos), 0))
    return index
