#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/).

Small files of every data version and feature, built with the tests'
independent format model (tests/craft.py, tests/craft_crypto.py), with a
metadata index no larger than its entries, so each seed is a few hundred
bytes instead of the 256 KiB a writer reserves. Encrypted seeds use the
fuzz targets' fixed key and password. Deterministic: rerunning rewrites the
same bytes.

    python3 fuzz/make_seeds.py
"""
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import craft  # noqa: E402
import craft_crypto as cc  # noqa: E402

KEY = bytes([0x46, 0x55, 0x5A, 0x5A, 0x2D, 0x6B, 0x65, 0x79]) + bytes(range(1, 25))
PASSWORD = b"fuzz password"
SALT = b"fuzz-salt-16byte"
NONCE = bytes(range(24))


def rec(name, dtype=b"<f4", shape=(3,), data=None, **kw):
    if isinstance(name, (list, tuple)):
        name = craft.encode_name(list(name))
    elif isinstance(name, str):
        name = name.encode()
    if data is None:
        n = 1
        for d in shape:
            n *= d
        itemsize = int(dtype[2:].split(b"\0")[0]) if dtype[1:2] != b"V" else int(dtype[2:].split(b"\0")[0])
        data = bytes((i * 7 + 3) & 0xFF for i in range(n * itemsize))
    return craft.Record(name=name, dtype=dtype, shape=tuple(shape), data=data, **kw)


def tight(tz: craft.TzFile) -> bytes:
    """The file with its metadata index exactly as long as its entries."""
    entries = tz.derive_entries()
    tz.metadata_len = max(1, sum(len(e.to_bytes(tz.tagged())) for e in entries))
    return tz.to_bytes()


def files():
    yield "v1_plain", tight(craft.TzFile(records=[rec("w", shape=(2, 2)), rec("b")], version=1))
    yield "v2_opaque", tight(craft.TzFile(
        records=[rec("bf", dtype=b"<V2\0torch.bfloat16", shape=(4,))], version=2))
    yield "v3_types", tight(craft.TzFile(records=[
        rec("p", tensor_type=craft.PARAM, module_idx=1),
        rec("buf", dtype=b"<i8", shape=(2,), tensor_type=craft.BUFFER),
        rec("big_endian", dtype=b">f8", shape=(2,)),
        rec("flag", dtype=b"|b1", shape=(3,)),
        rec("c", dtype=b"<c8", shape=(1,)),
    ], version=3))
    yield "v4_meta", tight(craft.TzFile(records=[
        rec("m", shape=(5, 5), data=b""), rec("x", shape=(2,))], version=4))
    yield "v4_structured", tight(craft.TzFile(records=[
        rec(["layers", 0, "weight"], shape=(2,)),
        rec(["layers", 1, "weight"], shape=(2,)),
        rec(["layers", 1, "bias"], dtype=b"<f2", shape=(1,)),
    ], version=4))
    yield "v5_long", tight(craft.TzFile(records=[
        rec("long", shape=(1, 3), long_dims=True), rec("short", shape=(2,))],
        version=5, flags=craft.FLAG_VERSIONED_HEADERS))
    yield "v4_scalar_empty", tight(craft.TzFile(records=[
        rec("scalar", shape=()), rec("empty", shape=(0, 4))], version=4))
    plain = tight(craft.TzFile(records=[
        rec("a", shape=(300,)), rec("b", dtype=b"<i2", shape=(5,)), rec("m", shape=(4,), data=b"")], version=4))
    yield "v4_enc_key", cc.encrypt_file(plain, KEY, chunk_size=1024, nonces=lambda i: NONCE)
    yield "v3_enc_seq", cc.encrypt_file(
        tight(craft.TzFile(records=[rec("s", shape=(9,))], version=2)), KEY, sequential=True,
        nonces=lambda i: NONCE)
    derived = cc.pwhash(PASSWORD, SALT, cc.OPS_MIN, cc.MEM_MIN)
    yield "v4_enc_password", cc.encrypt_file(
        tight(craft.TzFile(records=[rec("p", shape=(8,)), rec("q", dtype=b"<u1", shape=(3,))], version=4)),
        derived, chunk_size=1024, nonces=lambda i: NONCE,
        kdf=cc.kdf_chunk(cc.OPS_MIN, cc.MEM_MIN, SALT))


def tensor_headers(data: bytes):
    """(flags byte, header bytes) of each record of a seed file."""
    tz, layout = craft.parse(data)
    long_dims_of = {i: r.is_long() for i, r in enumerate(tz.records)}
    for i, span in enumerate(layout.records):
        flags = (1 if long_dims_of[i] else 0) | (2 if tz.has_crypt_info() else 0)
        yield bytes([flags]) + data[span.header_start:span.header_end]


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    for t in ("file_header", "tensor_header", "crypt_info", "tensor_path", "reader",
              "reader_coalesced", "writer"):
        shutil.rmtree(os.path.join(HERE, "corpus", t), ignore_errors=True)
    for name, data in files():
        write("reader", name, data)
        write("reader_coalesced", name, data)
        write("file_header", name, data[: craft.METADATA_START + struct.unpack_from("<Q", data, 65)[0]])
        for k, h in enumerate(tensor_headers(data)):
            write("tensor_header", f"{name}.{k}", h)
            tz, _ = craft.parse(data)
            ci = tz.records[k].crypt_info
            if ci:
                write("crypt_info", f"{name}.{k}", ci)
    write("crypt_info", "kdf_parallel", cc.crypt_info(
        cc.kdf_chunk(salt=SALT), cc.parallel_chunk(1024, NONCE, [bytes(16)] * 2)))
    write("crypt_info", "sequential", cc.crypt_info(cc.sequential_chunk(NONCE, bytes(16))))
    write("crypt_info", "empty", cc.EMPTY_CRYPT_INFO)
    for name, path in [("plain", b"model.layer.weight"), ("utf8", "gewicht.\u00e4\U0001F600".encode()),
                       ("structured", craft.encode_name(["a", 0, "b", 12])),
                       ("escapes", b'\x1e["q\\"uote","\\u00e9\\ud83d\\ude00",3]'),
                       ("several", b"a\0" + craft.encode_name(["a", "b"]) + b"\0" + craft.encode_name([1, 2])),
                       ("deep", b"\x1e[" + b",".join([b"0"] * 64) + b"]")]:
        write("tensor_path", name, path)
    # Writer inputs: mode byte, then per tensor: name length, name, dtype
    # length, dtype, ndim, dims, kind (fuzz_writer.cpp).
    def tensor(name, dtype, dims, kind=0):
        return bytes([len(name)]) + name + bytes([len(dtype)]) + dtype + bytes([len(dims)]) + bytes(dims) + bytes([kind])
    write("writer", "plain", b"\0" + tensor(b"w", b"<f4", [2, 3]) + tensor(b"b", b"<i8", [4]))
    write("writer", "encrypted", b"\1" + tensor(b"w", b"<f4", [16, 16]) + tensor(b"m", b"<f2", [3], kind=1))
    write("writer", "structured", b"\0" + tensor(craft.encode_name(["l", 0]), b"<V2\0torch.bfloat16", [2]) +
          tensor(craft.encode_name(["l", 1]), b">f8", [2], kind=8))
    write("writer", "conflict", b"\0" + tensor(b"x", b"<f4", [1]) + tensor(b"x", b"<f4", [1]) +
          tensor(craft.encode_name(["x", "y"]), b"|b1", [5]))


if __name__ == "__main__":
    main()
