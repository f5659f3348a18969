"""A small, independent, pure-Python model of the tensorizer file format.

Used by the tests to build well-formed files from scratch, to take apart files
written by a real serializer (ours or upstream's), to change individual fields,
and to put the file back together with every offset, length and hash
recomputed -- or deliberately left wrong.

Written from the format description (FORMAT.md, sections 1-4 and 9); it does not
import tensorizer.  Only plain (unencrypted) content is generated; crypt_info
blocks of parsed files are carried through as opaque bytes.

Layout reminder::

    "|TZR|" u32 version, 32-byte flags, u64 tensor_size, 8 unused, u64 count
    u64 M, M bytes of metadata (entries, then zero padding)
    records: header (u64 H ... i64 data length) + data, back to back
    u64 0 end marker
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple, Union

MAGIC = b"|TZR|"
DEFAULT_METADATA_LEN = 262144
FILE_HEADER_END = 65  # offset of the u64 metadata length
METADATA_START = 73  # offset of the first metadata entry
FIRST_RECORD = METADATA_START + DEFAULT_METADATA_LEN  # 262217

CRC32 = 0
SHA256 = 1
PARAM, BUFFER, STATE_DICT = 0, 1, 2

FLAG_ENCRYPTED = 0x01
FLAG_VERSIONED_HEADERS = 0x02

RS = b"\x1e"



def u8(v: int) -> bytes:
    return struct.pack("<B", v)


def u16(v: int) -> bytes:
    return struct.pack("<H", v)


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def i64(v: int) -> bytes:
    return struct.pack("<q", v)


def patch(data: bytes, offset: int, new: bytes) -> bytes:
    """Return ``data`` with ``new`` written over it at ``offset``."""
    assert 0 <= offset and offset + len(new) <= len(data), (offset, len(new))
    return data[:offset] + new + data[offset + len(new):]


# --------------------------------------------------------------------------
# names and dtypes


def structured_name(*components: Union[str, int]) -> bytes:
    """The json-seq form of a tensor path, exactly as upstream writes it."""
    return RS + json.dumps(
        list(components), ensure_ascii=True, separators=(",", ":")
    ).encode("ascii")


def encode_name(name: Union[str, bytes, Sequence[Union[str, int]]]) -> bytes:
    """Writer-canonical encoding of a name (str -> raw UTF-8, tuple -> json-seq)."""
    if isinstance(name, bytes):
        return name
    if isinstance(name, str):
        return name.encode("utf-8")
    comps = tuple(name)
    if len(comps) == 1 and isinstance(comps[0], str):
        return comps[0].encode("utf-8")
    return structured_name(*comps)


_NATIVE = {
    "float16": "<f2",
    "float32": "<f4",
    "float64": "<f8",
    "complex64": "<c8",
    "complex128": "<c16",
    "int8": "|i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "uint8": "|u1",
    "uint16": "<u2",
    "uint32": "<u4",
    "uint64": "<u8",
    "bool": "|b1",
}


def dtype_string(torch_dtype_name: str, itemsize: Optional[int] = None) -> bytes:
    """The on-disk dtype string for a torch dtype name such as ``"bfloat16"``."""
    if torch_dtype_name in _NATIVE:
        return _NATIVE[torch_dtype_name].encode()
    if itemsize is None:
        itemsize = {"bfloat16": 2, "complex32": 4, "bits16": 2}.get(
            torch_dtype_name, 1
        )
    order = "|" if itemsize == 1 else "<"
    return f"{order}V{itemsize}\0torch.{torch_dtype_name}".encode()


def tensor_bytes(t) -> bytes:
    """Raw C-order bytes of a torch tensor (or numpy array)."""
    import numpy

    if isinstance(t, numpy.ndarray):
        return numpy.ascontiguousarray(t).tobytes()
    import torch

    t = t.detach()
    if t.is_meta:
        return bytes(t.numel() * t.element_size())
    t = t.cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes()


# --------------------------------------------------------------------------
# model


@dataclass
class Hash:
    type: int
    value: Optional[bytes] = None  # None: compute when serializing
    length: Optional[int] = None  # None: natural length of the type / value

    def natural_length(self) -> int:
        if self.length is not None:
            return self.length
        if self.value is not None:
            return len(self.value)
        return {CRC32: 4, SHA256: 32}.get(self.type, 0)


def default_hashes() -> List[Hash]:
    return [Hash(CRC32), Hash(SHA256)]


@dataclass
class Record:
    """One tensor record (header + data)."""

    name: bytes
    dtype: bytes
    shape: Tuple[int, ...]
    data: bytes = b""
    module_idx: int = 0
    tensor_type: int = STATE_DICT
    hashes: Optional[List[Hash]] = None  # None -> [CRC32, SHA256], computed
    data_length: Optional[int] = None  # None -> len(data)
    long_dims: Optional[bool] = None  # None -> any(dim >= 2**32)
    crypt_info: Optional[bytes] = None  # body of the crypt_info block
    extra: bytes = b""  # junk between the hash section and the data length
    header_len: Optional[int] = None  # override the stored H

    def is_long(self) -> bool:
        if self.long_dims is not None:
            return self.long_dims
        return any(d >= 1 << 32 for d in self.shape)

    def length(self) -> int:
        return len(self.data) if self.data_length is None else self.data_length

    def build_header(
        self, with_crypt_info: bool = False, compute_hashes: bool = True
    ) -> bytes:
        """The complete header bytes (hash values filled in)."""
        return self._build(with_crypt_info, compute_hashes)[0]

    def computed_hashes(self, with_crypt_info: bool = False) -> List[bytes]:
        """What each hash entry's value *should* be (CRC32 / SHA-256 only)."""
        return self._build(with_crypt_info, True)[1]

    def _build(self, with_crypt_info: bool, compute_hashes: bool):
        hashes = default_hashes() if self.hashes is None else self.hashes
        dim_fmt = "Q" if self.is_long() else "I"
        body = bytearray()
        body += u16(self.module_idx) + u8(self.tensor_type)
        body += u16(len(self.name)) + self.name
        body += u8(len(self.dtype)) + self.dtype
        body += u8(len(self.shape))
        body += b"".join(struct.pack("<" + dim_fmt, d) for d in self.shape)
        hash_section = bytearray(u8(len(hashes)))
        value_spans = []
        for h in hashes:
            n = h.natural_length()
            hash_section += u8(h.type) + u8(n)
            value_spans.append((len(hash_section), n, h))
            hash_section += bytes(n)
        hash_pos = 8 + len(body) + 2
        body += u16(len(hash_section)) + hash_section
        crypt = b""
        if with_crypt_info:
            ci = self.crypt_info if self.crypt_info is not None else u16(0)
            crypt = u64(len(ci)) + ci
        tail = self.extra + i64(self.length())
        total = 8 + len(body) + len(crypt) + len(tail)
        h_stored = total if self.header_len is None else self.header_len
        zeroed = bytearray(u64(h_stored) + body + crypt + tail)
        hashable = bytes(zeroed[: 8 + len(body)]) + bytes(
            zeroed[8 + len(body) + len(crypt):]
        )
        crc = zlib.crc32(self.data, zlib.crc32(hashable))
        sha = hashlib.sha256(hashable + self.data).digest()
        computed = []
        for off, n, h in value_spans:
            computed.append(
                u32(crc) if h.type == CRC32 else sha if h.type == SHA256 else None
            )
            if h.value is not None:
                val = h.value
            elif not compute_hashes:
                val = bytes(n)
            elif h.type == CRC32:
                val = u32(crc)
            elif h.type == SHA256:
                val = sha
            else:
                val = bytes(n)
            val = (val + bytes(n))[:n]
            zeroed[hash_pos + off:hash_pos + off + n] = val
        return bytes(zeroed), computed


@dataclass
class Entry:
    """One metadata-index entry."""

    name: bytes
    tensor_type: int
    dtype: bytes
    shape: Tuple[int, ...]
    header_offset: int
    data_offset: int
    data_length: int
    long_dims: bool = False
    tag: Optional[int] = None  # u32 metadata version tag (v5 files)

    def to_bytes(self, tagged: bool) -> bytes:
        dim_fmt = "Q" if self.long_dims else "I"
        out = b""
        if tagged:
            tag = self.tag if self.tag is not None else (5 if self.long_dims else 1)
            out += u32(tag)
        out += u16(len(self.name)) + self.name + u8(self.tensor_type)
        out += u8(len(self.dtype)) + self.dtype + u8(len(self.shape))
        out += b"".join(struct.pack("<" + dim_fmt, d) for d in self.shape)
        out += u64(self.header_offset) + u64(self.data_offset) + u64(self.data_length)
        return out


@dataclass
class TzFile:
    records: List[Record] = field(default_factory=list)
    version: Optional[int] = None  # None -> derived from the records
    flags: Optional[int] = None  # None -> derived
    tensor_size: Optional[int] = None  # None -> sum of data lengths
    tensor_count: Optional[int] = None  # None -> len(entries)
    unused: bytes = bytes(8)
    metadata_len: int = DEFAULT_METADATA_LEN
    metadata_tagged: Optional[bool] = None  # None -> flags has bit 1
    entries: Optional[List[Entry]] = None  # None -> derived from records
    metadata_padding: Optional[bytes] = None  # None -> zeros up to metadata_len
    end_marker: bool = True
    trailing: bytes = b""
    compute_hashes: bool = True

    # ---- derived values
    def derived_version(self) -> int:
        if self.version is not None:
            return self.version
        v = 1
        for r in self.records:
            if b"\0" in r.dtype:
                v = max(v, 2)
            if r.length() == 0 and _numel(r.shape) > 0:
                v = max(v, 4)
            if r.is_long():
                v = max(v, 5)
        return v

    def derived_flags(self) -> int:
        if self.flags is not None:
            return self.flags
        return FLAG_VERSIONED_HEADERS if self.derived_version() >= 5 else 0

    def has_crypt_info(self) -> bool:
        v, f = self.derived_version(), self.derived_flags()
        return v == 3 or (v >= 4 and bool(f & FLAG_ENCRYPTED))

    def tagged(self) -> bool:
        if self.metadata_tagged is not None:
            return self.metadata_tagged
        return bool(self.derived_flags() & FLAG_VERSIONED_HEADERS)

    def record_headers(self) -> List[bytes]:
        ci = self.has_crypt_info()
        return [r.build_header(ci, self.compute_hashes) for r in self.records]

    def derive_entries(self) -> List[Entry]:
        pos = METADATA_START + self.metadata_len
        out = []
        for r, h in zip(self.records, self.record_headers()):
            out.append(
                Entry(
                    name=r.name,
                    tensor_type=r.tensor_type,
                    dtype=r.dtype,
                    shape=tuple(r.shape),
                    header_offset=pos,
                    data_offset=pos + len(h),
                    data_length=max(r.length(), 0),
                    long_dims=r.is_long(),
                )
            )
            pos += len(h) + len(r.data)
        return out

    def file_header(self) -> bytes:
        entries = self.entries if self.entries is not None else self.derive_entries()
        count = len(entries) if self.tensor_count is None else self.tensor_count
        size = (
            sum(len(r.data) for r in self.records)
            if self.tensor_size is None
            else self.tensor_size
        )
        return (
            MAGIC
            + u32(self.derived_version())
            + self.derived_flags().to_bytes(32, "little")
            + u64(size)
            + self.unused
            + u64(count)
        )

    def metadata_block(self) -> bytes:
        entries = self.entries if self.entries is not None else self.derive_entries()
        tagged = self.tagged()
        blob = b"".join(e.to_bytes(tagged) for e in entries)
        if self.metadata_padding is not None:
            blob += self.metadata_padding
        elif len(blob) <= self.metadata_len:
            blob += bytes(self.metadata_len - len(blob))
        return u64(self.metadata_len) + blob

    def to_bytes(self) -> bytes:
        out = bytearray(self.file_header())
        out += self.metadata_block()
        for r, h in zip(self.records, self.record_headers()):
            out += h + r.data
        if self.end_marker:
            out += u64(0)
        out += self.trailing
        return bytes(out)

    def copy(self) -> "TzFile":
        return dataclasses.replace(
            self,
            records=[dataclasses.replace(r) for r in self.records],
            entries=None if self.entries is None else [dataclasses.replace(e) for e in self.entries],
        )


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def record(
    name: Union[str, bytes, Sequence], tensor, *, module_idx=0, tensor_type=STATE_DICT, **kw
) -> Record:
    """A Record for a torch tensor or numpy array."""
    import numpy

    if isinstance(tensor, numpy.ndarray):
        dtype = tensor.dtype.str.encode()
        shape = tuple(tensor.shape)
        data = tensor_bytes(tensor)
    else:
        dname = str(tensor.dtype).replace("torch.", "")
        dtype = dtype_string(dname, tensor.element_size())
        shape = tuple(tensor.shape)
        data = b"" if tensor.is_meta else tensor_bytes(tensor)
    return Record(
        name=encode_name(name),
        dtype=dtype,
        shape=shape,
        data=data,
        module_idx=module_idx,
        tensor_type=tensor_type,
        **kw,
    )


def simple_file(tensors: dict, **kw) -> TzFile:
    """A TzFile holding ``{name: tensor}`` as STATE_DICT records."""
    return TzFile(records=[record(k, v) for k, v in tensors.items()], **kw)


# --------------------------------------------------------------------------
# parsing (strict; for well-formed files written by a serializer)


@dataclass
class Span:
    header_start: int
    header_end: int
    data_start: int
    data_end: int
    # positions of the fields inside the header (absolute offsets)
    name_start: int = 0
    dtype_start: int = 0
    shape_start: int = 0
    hash_section_start: int = 0  # the u16 L field
    data_length_pos: int = 0


@dataclass
class Layout:
    version: int
    flags: int
    tensor_size: int
    tensor_count: int
    metadata_len: int
    entry_spans: List[Tuple[int, int]]
    records: List[Span]
    end_marker: Optional[int]  # offset of the end marker, if present
    file_len: int


class _Reader:
    def __init__(self, data: bytes, pos: int = 0):
        self.data = data
        self.pos = pos

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError(f"truncated at {self.pos} (+{n})")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt: str):
        s = struct.Struct("<" + fmt)
        return s.unpack(self.take(s.size))


def parse(data: bytes) -> Tuple[TzFile, Layout]:
    """Take a file apart.  ``parse(b)[0].to_bytes() == b`` for writer output."""
    rd = _Reader(data)
    if rd.take(5) != MAGIC:
        raise ValueError("bad magic")
    (version,) = rd.unpack("I")
    flags = int.from_bytes(rd.take(32), "little")
    (tensor_size,) = rd.unpack("Q")
    unused = rd.take(8)
    (count,) = rd.unpack("Q")
    (mlen,) = rd.unpack("Q")
    mblock = rd.take(mlen)
    tagged = bool(flags & FLAG_VERSIONED_HEADERS)
    has_ci = version == 3 or (version >= 4 and bool(flags & FLAG_ENCRYPTED))

    entries: List[Entry] = []
    spans: List[Tuple[int, int]] = []
    mr = _Reader(mblock)
    for _ in range(count):
        start = mr.pos
        tag = None
        if tagged:
            (tag,) = mr.unpack("I")
        long_dims = tag is not None and tag >= 5
        (nlen,) = mr.unpack("H")
        name = mr.take(nlen)
        (ttype,) = mr.unpack("B")
        (dlen,) = mr.unpack("B")
        dtype = mr.take(dlen)
        (ndim,) = mr.unpack("B")
        shape = mr.unpack(("Q" if long_dims else "I") * ndim) if ndim else ()
        hoff, doff, dl = mr.unpack("QQQ")
        entries.append(
            Entry(name, ttype, dtype, tuple(shape), hoff, doff, dl, long_dims, tag)
        )
        spans.append((METADATA_START + start, METADATA_START + mr.pos))
    padding = mblock[mr.pos:]
    long_names = {e.name for e in entries if e.long_dims}

    records: List[Record] = []
    rspans: List[Span] = []
    pos = METADATA_START + mlen
    for e in entries:
        rd = _Reader(data, pos)
        (hlen,) = rd.unpack("Q")
        hdr = _Reader(data[pos:pos + hlen], 8)
        (midx, ttype) = hdr.unpack("HB")
        name_start = pos + hdr.pos
        (nlen,) = hdr.unpack("H")
        name = hdr.take(nlen)
        dtype_start = pos + hdr.pos
        (dlen,) = hdr.unpack("B")
        dtype = hdr.take(dlen)
        shape_start = pos + hdr.pos
        (ndim,) = hdr.unpack("B")
        long_dims = name in long_names
        shape = hdr.unpack(("Q" if long_dims else "I") * ndim) if ndim else ()
        hs_start = pos + hdr.pos
        (hslen,) = hdr.unpack("H")
        hsec = _Reader(hdr.take(hslen))
        (k,) = hsec.unpack("B")
        hashes = []
        for _ in range(k):
            (ht, hl) = hsec.unpack("BB")
            hashes.append(Hash(ht, hsec.take(hl)))
        ci = None
        if has_ci:
            (clen,) = hdr.unpack("Q")
            ci = hdr.take(clen)
        extra = hdr.data[hdr.pos:hlen - 8]
        (dlength,) = struct.unpack_from("<q", data, pos + hlen - 8)
        data_start = pos + hlen
        payload = data[data_start:data_start + max(dlength, 0)]
        records.append(
            Record(
                name=name,
                dtype=dtype,
                shape=tuple(shape),
                data=payload,
                module_idx=midx,
                tensor_type=ttype,
                hashes=hashes,
                data_length=dlength,
                long_dims=long_dims,
                crypt_info=ci,
                extra=extra,
            )
        )
        rspans.append(
            Span(
                pos,
                pos + hlen,
                data_start,
                data_start + max(dlength, 0),
                name_start,
                dtype_start,
                shape_start,
                hs_start,
                pos + hlen - 8,
            )
        )
        pos = data_start + max(dlength, 0)
    end = pos if data[pos:pos + 8] == bytes(8) else None
    tail_start = pos + 8 if end is not None else pos
    tz = TzFile(
        records=records,
        version=version,
        flags=flags,
        tensor_size=tensor_size,
        tensor_count=count,
        unused=unused,
        metadata_len=mlen,
        metadata_tagged=tagged,
        entries=entries,
        metadata_padding=padding,
        end_marker=end is not None,
        trailing=data[tail_start:],
    )
    lay = Layout(
        version, flags, tensor_size, count, mlen, spans, rspans, end, len(data)
    )
    return tz, lay


def layout(data: bytes) -> Layout:
    return parse(data)[1]


def relayout(tz: TzFile, rehash: bool = True, **changes) -> TzFile:
    """A copy with entries, offsets, sizes, count (and hashes) recomputed.

    Fields given as keyword arguments are set on the copy.  With ``rehash``,
    stored hash values are dropped so that they are recomputed (their types and
    lengths are kept).
    """
    out = tz.copy()
    out.entries = None
    out.tensor_count = None
    out.tensor_size = None
    out.metadata_padding = None
    out.metadata_tagged = None
    if rehash:
        for r in out.records:
            if r.hashes is not None:
                r.hashes = [Hash(h.type, None, h.natural_length()) for h in r.hashes]
    for k, v in changes.items():
        setattr(out, k, v)
    return out


def verify_record_hashes(data: bytes) -> List[Tuple[bytes, Optional[bool]]]:
    """Recompute every stored hash of every record: [(name, all_ok), ...].

    ``None`` for encrypted records (their hashes cover the plaintext).
    """
    tz, _ = parse(data)
    ci = tz.has_crypt_info()
    out = []
    for r in tz.records:
        if r.crypt_info is not None and r.crypt_info != u16(0):
            out.append((r.name, None))
            continue
        stored = [h.value for h in r.hashes]
        out.append((r.name, stored == r.computed_hashes(ci)))
    return out
