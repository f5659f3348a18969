"""``python -m tensorizer encrypt|decrypt``: adds and removes encryption on
existing files without changing a tensor, and fails cleanly."""

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
