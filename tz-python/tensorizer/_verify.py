"""
Checks every stored hash of a tensorizer file through libtensorizer, without
torch and in bounded memory: what ``python -m tensorizer verify`` runs.

Tensors are read in batches of about ``_BATCH_BYTES`` (or one tensor, if
larger) into one reused buffer, each batch on several threads. A batch that
fails a hash or decryption is checked again tensor by tensor, so every bad
tensor is reported, not only the first; any other failure (I/O, a damaged
header, a truncated file) ends the check.
"""

import dataclasses
import os
from typing import Callable, List, Optional, Union

from . import _native, stream_io
from ._crypt import DecryptionParams
from ._native import ffi

__all__ = ["VerifyReport", "verify_file"]

_BATCH_BYTES = 512 << 20
# Scratch memory that every read overwrites: no need to zero it first.
_scratch = ffi.new_allocator(should_clear_after_alloc=False)


@dataclasses.dataclass
class VerifyReport:
    tensors: int = 0  # tensors checked
    bytes: int = 0  # bytes of tensor data read
    failures: List[str] = dataclasses.field(default_factory=list)  # one message per bad tensor
    bad: List[int] = dataclasses.field(default_factory=list)  # their indices, in the same order

    @property
    def ok(self) -> bool:
        return not self.failures


def open_native_reader(
    src: Union[str, os.PathLike],
    decryption: Optional[DecryptionParams] = None,
    metadata_only: bool = False,
):
    """A tz_reader on a path or URI (closed with the returned object).

    With `metadata_only`, an encrypted file opens without a key: its index
    and headers can be listed, and reading its data fails."""
    lib = _native.lib
    uri = os.fspath(src)
    values = stream_io.http_options(uri) if stream_io.http_url(uri) is not None else {}
    if metadata_only:
        values["metadata_only"] = "1"
    opts = stream_io._native_options(values)
    if decryption is not None:
        _native.check(lib.tz_options_set_key(opts, decryption._native_key().ptr))
    out = ffi.new("tz_reader **")
    rc = lib.tz_reader_open(out, os.fsencode(uri), opts)
    if rc != 0:
        message = _native.error_message()
        if rc == lib.TZ_E_NOT_FOUND:
            raise FileNotFoundError(message)
        _native.raise_error(rc, message)
    return ffi.gc(out[0], lib.tz_reader_free)


def verify_file(
    src: Union[str, os.PathLike],
    decryption: Optional[DecryptionParams] = None,
    num_threads: int = 0,
    progress: Optional[Callable[[int, int], None]] = None,
) -> VerifyReport:
    """Reads every tensor of `src` with hash verification; see the module doc.

    `progress`, if given, is called as ``progress(bytes_done, bytes_total)``
    before the first batch and after each one."""
    lib = _native.lib
    reader = open_native_reader(src, decryption)
    count_p = ffi.new("uint64_t *")
    _native.check(lib.tz_reader_tensor_count(count_p, reader))
    sizes, meta = [], []
    info = ffi.new("tz_tensor_info *", {"version": lib.TZ_TENSOR_INFO_VERSION})
    for i in range(int(count_p[0])):
        _native.check(lib.tz_reader_tensor_info(info, reader, i))
        sizes.append(int(info.nbytes))
        meta.append(bool(info.is_meta))

    report = VerifyReport()
    stored = [i for i, m in enumerate(meta) if not m]
    for i, m in enumerate(meta):
        if m:
            # No data stored: the hashes cover the header; nothing to read.
            _check_one(lib.tz_reader_verify_bytes(reader, i, ffi.NULL, 0), report, i)
            report.tensors += 1
    # One buffer for every batch: a batch is at most _BATCH_BYTES, or one
    # larger tensor (bounded by the file, as the reader checked).
    largest = max((sizes[i] for i in stored), default=0)
    stored_bytes = sum(sizes[i] for i in stored)
    buffer = _scratch("uint8_t[]", max(largest, min(_BATCH_BYTES, stored_bytes), 1))
    if progress is not None:
        progress(0, stored_bytes)
    k = 0
    while k < len(stored):
        batch, total = [], 0
        while k < len(stored) and (not batch or total + sizes[stored[k]] <= _BATCH_BYTES):
            batch.append(stored[k])
            total += sizes[stored[k]]
            k += 1
        _verify_batch(reader, buffer, sizes, batch, num_threads, report)
        report.tensors += len(batch)
        report.bytes += total
        if progress is not None:
            progress(report.bytes, stored_bytes)
    return report


def _check_one(rc: int, report: VerifyReport, index: int) -> None:
    if rc in (_native.lib.TZ_E_HASH, _native.lib.TZ_E_CRYPTO):
        report.failures.append(_native.error_message())
        report.bad.append(index)
    elif rc != 0:
        _native.raise_error(rc)


def _verify_batch(reader, buffer, sizes, batch, num_threads: int, report: VerifyReport) -> None:
    lib = _native.lib
    requests = ffi.new("tz_read_request[]", len(batch))
    offset = 0
    for k, i in enumerate(batch):
        requests[k].version = lib.TZ_READ_REQUEST_VERSION
        requests[k].index = i
        requests[k].dst = buffer + offset
        requests[k].dst_size = sizes[i]
        offset += sizes[i]
    rc = lib.tz_reader_read_batch(reader, requests, len(batch), lib.TZ_READ_VERIFY_HASH, num_threads, ffi.NULL)
    if rc == 0:
        return
    if rc not in (lib.TZ_E_HASH, lib.TZ_E_CRYPTO):
        _native.raise_error(rc)
    # Which tensors? Each one again, alone.
    for k in range(len(batch)):
        _check_one(
            lib.tz_reader_read_batch(reader, requests + k, 1, lib.TZ_READ_VERIFY_HASH, num_threads, ffi.NULL),
            report,
            batch[k],
        )
