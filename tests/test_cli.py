"""``python -m tensorizer``: ``encrypt``/``decrypt`` add and remove encryption on
existing files without changing a tensor, ``info`` lists a file's tensors,
``verify`` checks every stored hash; all fail cleanly."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.ours_only  # upstream ships this as an example script only

VECTORS = Path(__file__).resolve().parent / "vectors"


def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "tensorizer", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


@pytest.mark.parametrize("vector", ["module", "v4_meta", "v2_opaque", "structured"])
def test_encrypt_then_decrypt_gives_back_the_same_bytes(tmp_path, vector):
    src = VECTORS / f"{vector}.tensors"
    enc, dec, key = tmp_path / "enc", tmp_path / "dec", tmp_path / "key.hex"
    r = _cli("encrypt", src, enc, "--new-keyfile", key)
    assert r.returncode == 0, r.stderr
    assert key.stat().st_mode & 0o777 == 0o600
    from tensorizer import DecryptionParams, TensorDeserializer

    params = DecryptionParams.from_key(bytes.fromhex(key.read_text()))
    with TensorDeserializer(enc, encryption=params, verify_hash=True) as t:
        assert len(t) > 0
    r = _cli("decrypt", enc, dec, "--keyfile", key)
    assert r.returncode == 0, r.stderr
    # Our writer lays files out as upstream does, so the round trip is exact.
    assert dec.read_bytes() == src.read_bytes()


def test_password_from_the_environment(tmp_path):
    src = VECTORS / "module.tensors"
    enc = tmp_path / "enc"
    env = {"TZ_PW": "correct horse"}
    r = _cli("encrypt", src, enc, "--password-env", "TZ_PW", "--opslimit", "min", "--memlimit", "min", env=env)
    assert r.returncode == 0, r.stderr
    from tensorizer import DecryptionParams, TensorDeserializer

    with TensorDeserializer(src) as plain, TensorDeserializer(
        enc, encryption=DecryptionParams.from_string("correct horse"), verify_hash=True
    ) as t:
        assert list(t.keys()) == list(plain.keys())
        for name in plain.keys():
            assert torch.equal(t[name], plain[name])
    pw_file = tmp_path / "pw"
    pw_file.write_text("correct horse\n")
    r = _cli("decrypt", enc, tmp_path / "dec", "--password-file", pw_file)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "dec").read_bytes() == src.read_bytes()


def test_failures_leave_nothing_behind_and_reveal_no_secret(tmp_path):
    src = VECTORS / "enc_random.tensors"
    wrong = tmp_path / "wrong.hex"
    wrong.write_text("ab" * 32 + "\n")
    dst = tmp_path / "out"
    r = _cli("decrypt", src, dst, "--keyfile", wrong)
    assert r.returncode == 1
    assert "decryption failed" in r.stderr
    assert "ab" * 32 not in r.stderr + r.stdout
    assert not dst.exists()
    assert os.listdir(tmp_path) == ["wrong.hex"]  # no temporary file either

    r = _cli("decrypt", src, dst, "--password-env", "TZ_PW", env={"TZ_PW": "s3cret-pw"})
    assert r.returncode == 1
    assert "s3cret-pw" not in r.stderr + r.stdout

    # Encrypting an encrypted file needs its key first: refused, and the new key file is removed.
    key = tmp_path / "new.hex"
    r = _cli("encrypt", src, dst, "--new-keyfile", key)
    assert r.returncode == 1
    assert "encrypted" in r.stderr
    assert not key.exists() and not dst.exists()


def test_existing_destination_needs_force(tmp_path):
    src = VECTORS / "module.tensors"
    dst = tmp_path / "dst"
    shutil.copy(VECTORS / "v1_plain.tensors", dst)
    before = dst.read_bytes()
    key = tmp_path / "k"
    key.write_bytes(bytes(range(32)))  # raw 32-byte key files are accepted too
    r = _cli("encrypt", src, dst, "--keyfile", key)
    assert r.returncode == 1 and "exists" in r.stderr
    assert dst.read_bytes() == before
    r = _cli("encrypt", src, dst, "--keyfile", key, "--force")
    assert r.returncode == 0, r.stderr
    assert dst.read_bytes() != before


VECTOR_KEY_HEX = "f6557a6dfe75ee066b30fcd911cb0db5c67dc4ba0a18fe6e7cc76b9d19c43139"


def test_info_lists_every_tensor():
    r = _cli("info", VECTORS / "module.tensors")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "9 tensors" in lines[0] and "encrypted: no" in lines[0]
    assert lines[1].split() == ["type", "dtype", "shape", "bytes", "name"]
    assert lines[2].split() == ["PARAM", "<f4", "[8,", "16]", "512", "0.weight"]
    assert len(lines) == 2 + 9
    r = _cli("info", VECTORS / "v4_meta.tensors")
    assert "(meta)" in r.stdout
    r = _cli("info", VECTORS / "structured.tensors")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[2].endswith("('enc', 'layers', 0, 'w')")


def test_info_lists_an_encrypted_file_without_its_key():
    # Tensor headers are stored in the clear; only the data needs the key.
    r = _cli("info", VECTORS / "enc_random.tensors")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "2 tensors" in lines[0] and "encrypted: yes" in lines[0]
    assert [line.split()[-1] for line in lines[2:]] == ["w", "b"]


@pytest.mark.parametrize("vector", ["module", "v4_meta", "v2_opaque", "structured", "big_plain"])
def test_verify_passes_intact_files(vector):
    r = _cli("verify", VECTORS / f"{vector}.tensors")
    assert r.returncode == 0, r.stderr
    assert "all hashes match" in r.stdout


def test_verify_reports_every_bad_tensor(tmp_path):
    from tensorizer import TensorDeserializer, TensorSerializer

    sd = {f"t{i}": torch.full((1000,), float(i)) for i in range(6)}
    src = tmp_path / "m.tensors"
    with TensorSerializer(src) as s:
        s.write_state_dict(sd)
    data = bytearray(src.read_bytes())
    with TensorDeserializer(src, lazy_load=True) as t:
        for e in t._entries:
            if e.name in ("t1", "t4"):
                data[e.data_offset + 7] ^= 0x10
    bad = tmp_path / "bad.tensors"
    bad.write_bytes(bytes(data))
    r = _cli("verify", bad)
    assert r.returncode == 1
    failed = [line for line in r.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 2 and "'t1'" in failed[0] and "'t4'" in failed[1]
    assert "6 tensors" in r.stdout and "2 failed" in r.stdout


def test_verify_in_small_batches_finds_the_same(tmp_path, monkeypatch):
    # Batches far smaller than the file: several batches, and the failing one
    # checked again tensor by tensor.
    from tensorizer import TensorDeserializer, TensorSerializer, _verify

    sd = {f"t{i}": torch.full((3000,), float(i)) for i in range(10)}
    sd["meta"] = torch.empty(4, device="meta")
    src = tmp_path / "m.tensors"
    with TensorSerializer(src) as s:
        s.write_state_dict(sd)
    monkeypatch.setattr(_verify, "_BATCH_BYTES", 30000)
    report = _verify.verify_file(src)
    assert report.ok and report.tensors == 11 and report.bytes == 10 * 12000
    data = bytearray(src.read_bytes())
    with TensorDeserializer(src, lazy_load=True) as t:
        offset = next(e.data_offset for e in t._entries if e.name == "t7")
    data[offset] ^= 1
    (tmp_path / "bad.tensors").write_bytes(bytes(data))
    report = _verify.verify_file(tmp_path / "bad.tensors", num_threads=2)
    assert report.tensors == 11 and len(report.failures) == 1 and "'t7'" in report.failures[0]


def test_verify_encrypted_files_needs_the_key(tmp_path):
    src = VECTORS / "enc_random.tensors"
    key = tmp_path / "k.hex"
    key.write_text(VECTOR_KEY_HEX + "\n")
    r = _cli("verify", src, "--keyfile", key)
    assert r.returncode == 0, r.stderr
    r = _cli("info", src, "--keyfile", key)
    assert r.returncode == 0 and "encrypted: yes" in r.stdout
    r = _cli("verify", src)
    assert r.returncode == 1 and "decryption was not requested" in r.stderr
    wrong = tmp_path / "wrong.hex"
    wrong.write_text("cd" * 32)
    r = _cli("verify", src, "--keyfile", wrong)
    assert r.returncode == 1
    assert "FAILED" in r.stdout and "cd" * 32 not in r.stdout + r.stderr
