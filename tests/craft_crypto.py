"""An independent model of tensorizer's encryption (FORMAT.md section 6).

Built on ``craft.py`` (the pure-Python file model) and on libsodium through
ctypes -- it never imports tensorizer, so it can check files written by the
implementation under test and craft encrypted files that no writer produces
(VECTORS.md G3, G16-G20): unusual nonces, chunk sizes, MAC counts, chunk
types.

crypt_info reminder (the body below is what ``craft.Record.crypt_info`` holds;
the header stores ``u64 len(body)`` in front of it)::

    u16 chunk_count, then per chunk: u64 chunk_len, u16 chunk_type, body
    type 1 (KDF):        u16 method=1, u64 opslimit, u64 memlimit, i32 alg,
                         u16 salt_len, salt
    type 2 (parallel):   u64 chunk_size, 24-byte nonce N0, u64 mac_count, MACs
    type 3 (sequential): 24-byte nonce, 16-byte MAC (one box over all data)

Chunk i of a type-2 tensor is a secretbox under nonce N0 + i, the 24 bytes
read as a little-endian integer.

This module is also imported by the upstream subprocess of the cross tests
(``tests/`` is on its ``sys.path``), for :func:`cross_tensors`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import random
import struct
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

import craft
from craft import SHA256, Hash, u16, u64

CHUNK_SIZE = 2 << 20  # the writer's fixed chunk size
KEY_BYTES = 32
NONCE_BYTES = 24
MAC_BYTES = 16
SALT_BYTES = 16
ALG_ARGON2ID13 = 2
OPS_MIN, MEM_MIN = 1, 8192

T_KDF, T_PARALLEL, T_SEQUENTIAL = 1, 2, 3
EMPTY_CRYPT_INFO = u16(0)  # an unencrypted tensor in an encrypted file

# Known answer (FORMAT.md 6.4), verified with raw libsodium.
KAT_PASSWORD = "hunter2"
KAT_SALT = b"0123456789abcdef"
KAT_KEY = bytes.fromhex("5f61a8c05708063a9a3a44fd63189f0169304a4e5cd1dbedbca1cb91c7d30494")


# --------------------------------------------------------------------------
# libsodium


def _load_sodium():
    for name in ("libsodium.so.23", ctypes.util.find_library("sodium"), "libsodium.so"):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if lib.sodium_init() < 0:
            continue
        lib.crypto_secretbox_detached.argtypes = [
            ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
            ctypes.c_ulonglong, ctypes.c_char_p, ctypes.c_char_p,
        ]
        lib.crypto_secretbox_open_detached.argtypes = [
            ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
            ctypes.c_ulonglong, ctypes.c_char_p, ctypes.c_char_p,
        ]
        lib.crypto_pwhash.argtypes = [
            ctypes.c_char_p, ctypes.c_ulonglong, ctypes.c_char_p,
            ctypes.c_ulonglong, ctypes.c_char_p, ctypes.c_ulonglong,
            ctypes.c_size_t, ctypes.c_int,
        ]
        return lib
    return None


SODIUM = _load_sodium()


def _need_sodium():
    if SODIUM is None:
        raise RuntimeError("libsodium (libsodium.so.23) not found")
    return SODIUM


def secretbox(message: bytes, nonce: bytes, key: bytes) -> Tuple[bytes, bytes]:
    """crypto_secretbox_detached: (ciphertext, 16-byte MAC)."""
    lib = _need_sodium()
    assert len(nonce) == NONCE_BYTES and len(key) == KEY_BYTES
    ct = ctypes.create_string_buffer(max(len(message), 1))
    mac = ctypes.create_string_buffer(MAC_BYTES)
    rc = lib.crypto_secretbox_detached(ct, mac, bytes(message), len(message), nonce, key)
    assert rc == 0
    return ct.raw[: len(message)], mac.raw


def secretbox_open(ciphertext: bytes, mac: bytes, nonce: bytes, key: bytes) -> Optional[bytes]:
    """crypto_secretbox_open_detached: the plaintext, or None if the MAC fails."""
    lib = _need_sodium()
    pt = ctypes.create_string_buffer(max(len(ciphertext), 1))
    rc = lib.crypto_secretbox_open_detached(pt, bytes(ciphertext), bytes(mac), len(ciphertext), nonce, key)
    return pt.raw[: len(ciphertext)] if rc == 0 else None


def pwhash(password, salt: bytes, opslimit: int = OPS_MIN, memlimit: int = MEM_MIN, alg: int = ALG_ARGON2ID13) -> bytes:
    """crypto_pwhash with a 32-byte output (FORMAT.md 6.4)."""
    lib = _need_sodium()
    if isinstance(password, str):
        password = password.encode("utf-8")
    out = ctypes.create_string_buffer(KEY_BYTES)
    rc = lib.crypto_pwhash(out, KEY_BYTES, password, len(password), salt, opslimit, memlimit, alg)
    assert rc == 0, "crypto_pwhash failed"
    return out.raw


def nonce_add(nonce: bytes, i: int) -> bytes:
    """N0 + i: the 24 bytes as a little-endian integer, wrapping like sodium_increment."""
    n = (int.from_bytes(nonce, "little") + i) % (1 << (8 * NONCE_BYTES))
    return n.to_bytes(NONCE_BYTES, "little")


def encrypt_chunks(plain: bytes, key: bytes, nonce0: bytes, chunk_size: int = CHUNK_SIZE) -> Tuple[bytes, List[bytes]]:
    """Type-2 encryption: (ciphertext, [MAC of chunk i under N0 + i])."""
    ct, macs = [], []
    for i, start in enumerate(range(0, len(plain), chunk_size)):
        c, m = secretbox(plain[start:start + chunk_size], nonce_add(nonce0, i), key)
        ct.append(c)
        macs.append(m)
    return b"".join(ct), macs


# --------------------------------------------------------------------------
# crypt_info blocks


def chunk(chunk_type: int, body: bytes) -> bytes:
    """One length-prefixed crypt_info chunk (chunk_len counts the type field)."""
    return u64(2 + len(body)) + u16(chunk_type) + body


def crypt_info(*chunks: bytes) -> bytes:
    return u16(len(chunks)) + b"".join(chunks)


def kdf_chunk(opslimit=OPS_MIN, memlimit=MEM_MIN, salt=KAT_SALT, alg=ALG_ARGON2ID13, method=1) -> bytes:
    body = u16(method) + u64(opslimit) + u64(memlimit) + struct.pack("<i", alg) + u16(len(salt)) + salt
    return chunk(T_KDF, body)


def parallel_chunk(chunk_size: int, nonce0: bytes, macs: Sequence[bytes], mac_count: Optional[int] = None) -> bytes:
    n = len(macs) if mac_count is None else mac_count
    return chunk(T_PARALLEL, u64(chunk_size) + nonce0 + u64(n) + b"".join(macs))


def sequential_chunk(nonce: bytes, mac: bytes) -> bytes:
    return chunk(T_SEQUENTIAL, nonce + mac)


@dataclass
class CiChunk:
    type: int
    offset: int  # of the u64 chunk_len, relative to the crypt_info body
    body: bytes  # after the u16 type
    # type 1
    method: Optional[int] = None
    opslimit: Optional[int] = None
    memlimit: Optional[int] = None
    alg: Optional[int] = None
    salt: Optional[bytes] = None
    # type 2 / 3
    chunk_size: Optional[int] = None
    nonce: Optional[bytes] = None
    mac_count: Optional[int] = None
    macs: List[bytes] = field(default_factory=list)

    @property
    def nonce_offset(self) -> int:
        """Offset of the nonce, relative to the crypt_info body (types 2, 3)."""
        return self.offset + 10 + (8 if self.type == T_PARALLEL else 0)

    def mac_offset(self, i: int) -> int:
        if self.type == T_SEQUENTIAL:
            return self.offset + 10 + NONCE_BYTES
        return self.offset + 10 + 8 + NONCE_BYTES + 8 + MAC_BYTES * i


def parse_crypt_info(body: bytes) -> List[CiChunk]:
    """Parse a well-formed crypt_info body (strict; asserts on malformed input)."""
    (count,) = struct.unpack_from("<H", body, 0)
    pos = 2
    out = []
    for _ in range(count):
        (clen,) = struct.unpack_from("<Q", body, pos)
        (ctype,) = struct.unpack_from("<H", body, pos + 8)
        cb = body[pos + 10:pos + 8 + clen]
        assert len(cb) == clen - 2, "crypt_info chunk runs past the block"
        c = CiChunk(ctype, pos, cb)
        if ctype == T_KDF:
            c.method, c.opslimit, c.memlimit, c.alg, slen = struct.unpack_from("<HQQiH", cb, 0)
            c.salt = cb[24:24 + slen]
        elif ctype == T_PARALLEL:
            c.chunk_size, c.nonce, c.mac_count = struct.unpack_from("<Q24sQ", cb, 0)
            c.macs = [cb[40 + 16 * i:56 + 16 * i] for i in range(c.mac_count)]
        elif ctype == T_SEQUENTIAL:
            c.nonce, mac = cb[:24], cb[24:40]
            c.macs = [mac]
        out.append(c)
        pos += 8 + clen
    assert pos == len(body), "trailing bytes after the last crypt_info chunk"
    return out


@dataclass
class CryptRecord:
    """Where one record's crypt_info and data lie in a file (absolute offsets)."""

    name: bytes
    record: craft.Record
    span: craft.Span
    ci_len_pos: int  # the u64 length prefix of the block
    ci_start: int  # the body (u16 chunk_count)
    chunks: List[CiChunk]

    @property
    def data_start(self) -> int:
        return self.span.data_start

    @property
    def data_end(self) -> int:
        return self.span.data_end

    def cipher(self) -> Optional[CiChunk]:
        found = [c for c in self.chunks if c.type in (T_PARALLEL, T_SEQUENTIAL)]
        return found[0] if found else None

    def kdf(self) -> Optional[CiChunk]:
        found = [c for c in self.chunks if c.type == T_KDF]
        return found[0] if found else None

    def mac_pos(self, i: int) -> int:
        return self.ci_start + self.cipher().mac_offset(i)

    def nonce_pos(self) -> int:
        return self.ci_start + self.cipher().nonce_offset


def crypt_records(data: bytes) -> List[CryptRecord]:
    """Locate every record's crypt_info in a file that carries crypt_info."""
    tz, lay = craft.parse(data)
    assert tz.has_crypt_info(), "this file carries no crypt_info blocks"
    out = []
    for r, sp in zip(tz.records, lay.records):
        ci_start = sp.data_length_pos - len(r.extra) - len(r.crypt_info)
        out.append(CryptRecord(r.name, r, sp, ci_start - 8, ci_start, parse_crypt_info(r.crypt_info)))
    return out


def by_name(data: bytes) -> dict:
    return {cr.name.decode(): cr for cr in crypt_records(data)}


def decrypt_record(cr: CryptRecord, data: bytes, key: bytes) -> bytes:
    """Independent decryption of one record; raises ValueError on a MAC failure."""
    ct = data[cr.data_start:cr.data_end]
    c = cr.cipher()
    if c is None:
        return ct
    if c.type == T_SEQUENTIAL or c.mac_count == 1:
        parts = [(ct, c.macs[0], c.nonce)]
    else:
        parts = [
            (ct[i * c.chunk_size:(i + 1) * c.chunk_size], c.macs[i], nonce_add(c.nonce, i))
            for i in range(c.mac_count)
        ]
        assert sum(len(p[0]) for p in parts) == len(ct), "mac_count does not cover the data"
    out = []
    for part, mac, nonce in parts:
        pt = secretbox_open(part, mac, nonce, key)
        if pt is None:
            raise ValueError(f"MAC check failed in {cr.name!r}")
        out.append(pt)
    return b"".join(out)


# --------------------------------------------------------------------------
# encrypting an unencrypted file

# make_crypt_info(index, nonce0, macs, record) -> crypt_info body
MakeCryptInfo = Callable[[int, bytes, List[bytes], craft.Record], bytes]


def encrypt_file(
    plain: bytes,
    key: bytes,
    *,
    chunk_size: int = CHUNK_SIZE,
    nonces: Optional[Callable[[int], bytes]] = None,
    kdf: Optional[bytes] = None,
    sequential: bool = False,
    make_crypt_info: Optional[MakeCryptInfo] = None,
    box_empty: bool = False,
) -> bytes:
    """Encrypt every tensor with data of an unencrypted file, the way writers do.

    Versions below 4 become 3 (flags stay zero there); 4 and up get flag bit 0.
    Encrypted records get a SHA-256-only hash over the plaintext (FORMAT.md
    4.6); records without data keep their hashes and get an empty crypt_info.
    ``nonces(i)`` gives record i's N0 (default: random).  ``kdf`` is a
    type-1 chunk put in front.  ``sequential`` writes one type-3 box per tensor
    instead of type-2 chunks.  ``make_crypt_info`` replaces the whole
    crypt_info body of each encrypted record.  ``box_empty`` also gives
    zero-length tensors a type-2 chunk with one MAC (of the empty message).
    """
    tz, _ = craft.parse(plain)
    if tz.has_crypt_info():
        raise ValueError("already carries crypt_info")
    version, flags = tz.version, tz.flags
    if version < 4:
        version, flags = 3, 0
    else:
        flags |= craft.FLAG_ENCRYPTED
    out = craft.relayout(tz, version=version, flags=flags)
    for i, r in enumerate(out.records):
        n0 = nonces(i) if nonces is not None else os.urandom(NONCE_BYTES)
        if r.length() <= 0 and not box_empty:
            r.crypt_info = EMPTY_CRYPT_INFO
            continue
        plain_data = r.data
        if sequential:
            ct, mac = secretbox(plain_data, n0, key)
            macs = [mac]
            body_chunks = [sequential_chunk(n0, mac)]
        else:
            ct, macs = encrypt_chunks(plain_data, key, n0, chunk_size)
            if not plain_data:  # box_empty
                macs = [secretbox(b"", n0, key)[1]]
            body_chunks = [parallel_chunk(chunk_size, n0, macs)]
        if make_crypt_info is not None:
            r.crypt_info = make_crypt_info(i, n0, macs, r)
        else:
            r.crypt_info = crypt_info(*([kdf] if kdf else []), *body_chunks)
        # the hash covers the plaintext and the header as finally laid out
        r.hashes = [Hash(SHA256)]
        r.hashes = [Hash(SHA256, r.computed_hashes(True)[0])]
        r.data = ct
    return out.to_bytes()


def header_version_flags(data: bytes) -> Tuple[int, int]:
    """(u32 data version, 256-bit flags) from a file's first 41 bytes."""
    return struct.unpack_from("<I", data, 5)[0], int.from_bytes(data[9:41], "little")


# --------------------------------------------------------------------------
# tensors shared by both sides of the cross tests


def det_bytes(n: int, seed: int) -> bytes:
    """Deterministic pseudo-random bytes (same in every Python >= 3.9)."""
    return random.Random(seed).randbytes(n)


def cross_tensors(case: str) -> dict:
    """{name: tensor} for cross-test case ``case`` (needs torch)."""
    import torch

    def u8(n, seed):
        return torch.frombuffer(bytearray(det_bytes(n, seed)), dtype=torch.uint8)

    small = torch.arange(10, dtype=torch.float32)
    if case in ("up_random", "up_key", "ours_random"):
        return {"small": small, "one_chunk": u8(CHUNK_SIZE, 1), "two_chunks": u8(CHUNK_SIZE + 1, 2)}
    if case in ("up_password", "ours_password"):
        return {"small": small, "w": torch.linspace(-1, 1, 1000, dtype=torch.float64).reshape(10, 100)}
    if case == "ours_key":
        return {
            "small": small,
            "one_chunk": u8(CHUNK_SIZE, 1),
            "two_chunks": u8(CHUNK_SIZE + 1, 2),
            "three_chunks": u8(5 * 2**20 + 3, 3),
        }
    if case in ("up_meta", "ours_meta"):
        return {"small": small, "meta": torch.empty(4, 5, device="meta"), "after": u8(3000, 4)}
    if case == "ours_bf16":
        return {"bf": torch.linspace(-3, 3, 999).to(torch.bfloat16), "small": small}
    if case == "ours_empty":
        return {"before": small, "empty": torch.zeros(0), "empty2d": torch.zeros(3, 0, dtype=torch.int16), "after": u8(1500, 5)}
    raise KeyError(case)


def describe_tensors(mapping) -> dict:
    """{name: [dtype, shape, sha256 of the raw bytes]} for a loaded mapping."""
    import hashlib

    import torch

    out = {}
    for k in mapping.keys():
        t = mapping[k]
        if t.is_meta:
            raw = bytes(t.numel() * t.element_size())
        else:
            t = t.detach().cpu().contiguous().reshape(-1)
            raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        out[str(k)] = [str(t.dtype), list(mapping[k].shape), hashlib.sha256(raw).hexdigest()]
    return out
