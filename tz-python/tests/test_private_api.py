"""Private names of upstream's serialization module that its examples and
users call: perf stats, TensorDeserializer._verify_hashes and
TensorSerializer._write."""

import hashlib
import io
import os
import subprocess
import sys
import zlib

import pytest
import torch

from tensorizer import TensorDeserializer, TensorSerializer, serialization
from tensorizer.serialization import HashMismatchError, HashType, TensorHash


def _file(tmp_path, sd):
    path = tmp_path / "m.tensors"
    with TensorSerializer(path) as s:
        s.write_state_dict(sd)
    return path


def test_perf_stats_off_by_default_and_from_the_environment():
    env = dict(os.environ)
    env.pop("TENSORIZER_ENABLE_PERF_STATS", None)
    code = (
        "from tensorizer import serialization as s\n"
        "print(s._enable_perf_stats)\n"
        "try:\n    s._get_perf_stats()\nexcept RuntimeError as e:\n    print('off')\n"
        "else:\n    print(sorted(s._get_perf_stats().items()))\n"
    )
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert off.stdout.split("\n")[:2] == ["False", "off"]
    env["TENSORIZER_ENABLE_PERF_STATS"] = "1"
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert on.stdout.split("\n")[:2] == [
        "True",
        "[('file_readinto_bytes', 0), ('file_readinto_secs', 0.0),"
        " ('tensor_to_device_bytes', 0), ('tensor_to_device_secs', 0.0)]",
    ]


def test_perf_stats_count_reads(tmp_path, monkeypatch):
    sd = {"a": torch.randn(1000), "b": torch.arange(10, dtype=torch.int16)}
    path = _file(tmp_path, sd)
    monkeypatch.setattr(serialization, "_perf_stats", serialization._PerfStats())
    with TensorDeserializer(path, device="cpu") as t:
        assert torch.equal(t["a"], sd["a"])
    stats = serialization._get_perf_stats()
    assert stats["file_readinto_bytes"] == 4000 + 20
    assert stats["file_readinto_secs"] > 0
    assert stats["tensor_to_device_bytes"] == 0  # already on its device
    with TensorDeserializer(path, device="cpu", lazy_load=True) as t:
        t["b"]
    assert serialization._get_perf_stats()["file_readinto_bytes"] == 4020 + 20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_perf_stats_count_copies_to_the_gpu(tmp_path, monkeypatch):
    sd = {"a": torch.randn(1 << 20), "b": torch.arange(10)}
    path = _file(tmp_path, sd)
    monkeypatch.setattr(serialization, "_perf_stats", serialization._PerfStats())
    with TensorDeserializer(path, device="cuda") as t:
        assert torch.equal(t["a"].cpu(), sd["a"])
    stats = serialization._get_perf_stats()
    assert stats["tensor_to_device_bytes"] == 4 * (1 << 20) + 80
    assert stats["tensor_to_device_secs"] > 0


def test_verify_hashes(tmp_path):
    data = b"tensor bytes"
    header = b"a header"
    crc_header = zlib.crc32(header)
    sha_header = hashlib.sha256(header)
    good = [
        TensorHash(HashType.CRC32, zlib.crc32(data, crc_header).to_bytes(4, "little")),
        TensorHash(HashType.SHA256, hashlib.sha256(header + data).digest()),
    ]
    header_hashes = {HashType.CRC32: crc_header, HashType.SHA256: sha_header}
    with TensorDeserializer(_file(tmp_path, {"x": torch.arange(3), "m": torch.empty(2, device="meta")})) as t:
        t._verify_hashes("x", good, header_hashes, memoryview(data))
        assert sha_header.digest() == hashlib.sha256(header).digest()  # not consumed
        for bad in good:
            wrong = TensorHash(bad.type, bytes(len(bad.hash)))
            with pytest.raises(HashMismatchError, match="'x' failed"):
                t._verify_hashes("x", [wrong], header_hashes, data)
        # A tensor stored without data is checked as empty, whatever is passed.
        empty = [TensorHash(HashType.CRC32, crc_header.to_bytes(4, "little"))]
        t._verify_hashes("m", empty, header_hashes, data)
        with pytest.raises(ValueError, match="invalid hash type"):
            t._verify_hashes("x", [TensorHash(7, b"")], header_hashes, data)


class _Trickle(io.BytesIO):
    """Writes at most 3 bytes per call."""

    def write(self, b):
        with memoryview(b) as mv:
            return super().write(mv[:3])


def test_serializer_write_loops_over_short_writes(tmp_path):
    target = _Trickle()
    s = TensorSerializer(target)
    try:
        target.seek(0, io.SEEK_END)
        end = target.tell()
        assert s._write(b"0123456789") == 10
        assert target.getvalue()[end:] == b"0123456789"
        # Stops once `expected_bytes_written` is reached (here after two calls).
        assert s._write(bytearray(b"abcdef"), expected_bytes_written=4) == 6
        assert s._write(b"ab", expected_bytes_written=2) == 2
        with pytest.raises(ValueError, match="more data than expected"):
            s._write(b"xyz", expected_bytes_written=2)
    finally:
        s._release(close_file=False)
    with TensorSerializer(tmp_path / "p.tensors") as s2, pytest.raises(io.UnsupportedOperation):
        s2._write(b"x")


def test_a_replaced_tensor_hash_is_honoured(tmp_path, monkeypatch):
    # Upstream's suite replaces TensorHash with a double that zeroes every
    # stored hash and expects a verified load to fail; loads that do not
    # verify, and the intact class, are unaffected.
    sd = {"w": torch.arange(1000, dtype=torch.int32), "b": torch.ones(3)}
    path = _file(tmp_path, sd)
    made = []

    def zeroed(*args, **kwargs):
        h = TensorHash(*args, **kwargs)
        made.append(h.type)
        h.hash = bytes(len(h.hash))
        return h

    monkeypatch.setattr(serialization, "TensorHash", zeroed)
    with pytest.raises(HashMismatchError, match="failed CRC32 verification"):
        TensorDeserializer(path, verify_hash=True).close()
    assert made and set(made) <= {HashType.CRC32, HashType.SHA256}
    with TensorDeserializer(path, verify_hash=False) as t:
        assert torch.equal(t["w"], sd["w"])

    def faithful(*args, **kwargs):
        return TensorHash(*args, **kwargs)

    monkeypatch.setattr(serialization, "TensorHash", faithful)
    with TensorDeserializer(path, verify_hash=True, lazy_load=True) as t:
        assert torch.equal(t["b"], sd["b"])
    monkeypatch.undo()
    # Real corruption is caught natively either way.
    data = bytearray(path.read_bytes())
    at = bytes(data).rfind(sd["w"].numpy().tobytes())
    data[at + 40] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(HashMismatchError):
        TensorDeserializer(path, verify_hash=True).close()
