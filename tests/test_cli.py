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


# ---- The command: --version, --help, exit codes, --json, progress ----------

import json  # noqa: E402

MANIFEST = json.loads((VECTORS / "manifest.json").read_text())


def _one_line_error(r, command):
    # Bad input gives one line on stderr, never a traceback.
    assert "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"tensorizer {command}: error: "), r.stderr


def _damaged_copy(tmp_path) -> Path:
    """module.tensors with one byte of one tensor's data flipped."""
    from tensorizer import TensorDeserializer

    src = VECTORS / "module.tensors"
    data = bytearray(src.read_bytes())
    with TensorDeserializer(src, lazy_load=True) as t:
        data[t._entries[0].data_offset + 3] ^= 0x40
    bad = tmp_path / "damaged.tensors"
    bad.write_bytes(bytes(data))
    return bad


def test_version_names_the_package_and_the_library():
    import tensorizer
    from tensorizer._native import native_version

    r = _cli("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(f"tensorizer {tensorizer.__version__} ")
    assert f"libtensorizer {native_version()}" in r.stdout.splitlines()


@pytest.mark.parametrize("command", [[], ["info"], ["verify"], ["encrypt"], ["decrypt"]])
def test_help_documents_the_exit_codes(command):
    r = _cli(*command, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: {' '.join(['tensorizer', *command])} ")
    assert "exit status" in r.stdout
    for line in ("0    success", "1    failure", "2    usage error", "130  interrupted"):
        assert line in r.stdout


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["frobnicate", "x"],
        ["verify"],
        ["verify", "x", "--threads", "many"],
        ["encrypt", "a", "b"],  # no key option
        ["decrypt", "a", "b", "--keyfile", "k", "--password-env", "V"],
        ["info", "x", "--quiet"],  # info draws no progress bar
    ],
)
def test_usage_errors_exit_2(args):
    r = _cli(*args)
    assert r.returncode == 2
    assert "usage: tensorizer" in r.stderr and "Traceback" not in r.stderr


def test_main_returns_the_status_instead_of_exiting(capsys):
    from tensorizer.__main__ import main

    assert main(["--help"]) == 0
    assert main(["verify"]) == 2
    assert main(["verify", str(VECTORS / "module.tensors")]) == 0
    assert main(["info", "/nonexistent/x.tensors"]) == 1
    capsys.readouterr()


@pytest.mark.parametrize("command", ["info", "verify", "encrypt", "decrypt"])
@pytest.mark.parametrize("problem", ["missing", "truncated", "not_tensorizer"])
def test_unreadable_input_exits_1_with_one_line(tmp_path, command, problem):
    src = tmp_path / "src.tensors"
    if problem == "truncated":
        src.write_bytes((VECTORS / "module.tensors").read_bytes()[:100000])
    elif problem == "not_tensorizer":
        src.write_bytes(b"PK\x03\x04 this is a zip file, not tensors" * 100)
    key = tmp_path / "k.hex"
    key.write_text(VECTOR_KEY_HEX)
    dst = tmp_path / "dst"
    extra = [dst, "--keyfile", key] if command in ("encrypt", "decrypt") else []
    r = _cli(command, src, *extra)
    assert r.returncode == 1
    _one_line_error(r, command)
    assert not dst.exists()


def test_damaged_data_fails_encrypt_cleanly(tmp_path):
    bad = _damaged_copy(tmp_path)
    key, dst = tmp_path / "new.hex", tmp_path / "dst"
    r = _cli("encrypt", bad, dst, "--new-keyfile", key)
    assert r.returncode == 1
    _one_line_error(r, "encrypt")
    assert not dst.exists() and not key.exists()
    assert sorted(os.listdir(tmp_path)) == ["damaged.tensors"]


def test_interrupt_exits_130_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    from tensorizer import _progress
    from tensorizer.__main__ import main

    def interrupt(self, done, total=None):
        if done:  # the first batch is written: the temporary file exists
            raise KeyboardInterrupt

    monkeypatch.setattr(_progress.Progress, "update", interrupt)
    key, dst = tmp_path / "new.hex", tmp_path / "dst"
    src = VECTORS / "big_plain.tensors"
    assert main(["encrypt", str(src), str(dst), "--new-keyfile", str(key)]) == 130
    assert os.listdir(tmp_path) == []  # no key, no DST, no temporary file
    assert main(["verify", str(src)]) == 130
    err = capsys.readouterr().err
    assert "tensorizer encrypt: interrupted" in err and "tensorizer verify: interrupted" in err


@pytest.mark.parametrize("vector", ["module", "structured", "v4_meta", "enc_random"])
def test_info_json(vector):
    r = _cli("info", VECTORS / f"{vector}.tensors", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    expected = MANIFEST[vector]["tensors"]
    assert doc["tensor_count"] == len(doc["tensors"]) == len(expected)
    assert doc["encrypted"] is (vector == "enc_random")
    for t in doc["tensors"]:
        assert set(t) == {"name", "path", "type", "dtype", "shape", "size", "meta"}
    by_name = {t["name"]: t for t in doc["tensors"]}
    if vector == "module":
        assert by_name["0.weight"] == {
            "name": "0.weight",
            "path": ["0.weight"],
            "type": "PARAM",
            "dtype": "<f4",
            "shape": [8, 16],
            "size": 512,
            "meta": False,
        }
    if vector == "structured":
        assert doc["tensors"][0]["path"] == ["enc", "layers", 0, "w"]
    if vector == "v4_meta":
        assert any(t["meta"] for t in doc["tensors"])
    assert doc["data_bytes"] == sum(t["size"] for t in doc["tensors"])


def test_verify_json_keeps_the_exit_codes(tmp_path):
    r = _cli("verify", VECTORS / "module.tensors", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["failed"] == 0 and doc["failures"] == []
    assert doc["tensors"] == len(MANIFEST["module"]["tensors"])

    r = _cli("verify", _damaged_copy(tmp_path), "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["failed"] == 1 and doc["tensors"] == 9
    (bad,) = doc["failures"]
    assert bad["index"] == 0 and bad["name"] == "0.weight" and "0.weight" in bad["reason"]

    r = _cli("verify", tmp_path / "missing.tensors", "--json")
    assert r.returncode == 1
    assert "No such file" in json.loads(r.stdout)["error"]
    _one_line_error(r, "verify")


def _cli_on_tty(*args):
    """Runs the command with stderr on a pseudo-terminal; returns (tty bytes, stdout, status)."""
    master, slave = os.openpty()
    try:
        p = subprocess.Popen(
            [sys.executable, "-m", "tensorizer", *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=slave,
            stdin=subprocess.DEVNULL,
        )
    finally:
        os.close(slave)
    seen = b""
    try:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every end of the terminal is closed
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
    out, _ = p.communicate(timeout=120)
    return seen.decode(), out.decode(), p.returncode


PROGRESS_RE = r"\r\w+ +100% \[#+\] 2\.1 MB/2\.1 MB  [\d.]+ [kMG]?B/s  ETA 0:00"


def test_progress_bar_on_a_terminal(tmp_path):
    import re

    src = VECTORS / "big_plain.tensors"
    tty, out, rc = _cli_on_tty("verify", src)
    assert rc == 0 and "all hashes match" in out
    # The first frame, the final frame (always drawn), and the line ended.
    assert "verify   0% [" in tty and "ETA --:--" in tty
    assert re.search(PROGRESS_RE, tty), repr(tty)
    assert tty.endswith("\n") and "ETA" not in out
    key = tmp_path / "k.hex"
    tty, out, rc = _cli_on_tty("encrypt", src, tmp_path / "enc", "--new-keyfile", key)
    assert rc == 0 and re.search(PROGRESS_RE, tty) and tty.startswith("\rencrypt "), repr(tty)
    tty, out, rc = _cli_on_tty("decrypt", tmp_path / "enc", tmp_path / "dec", "--keyfile", key)
    assert rc == 0 and re.search(PROGRESS_RE, tty) and tty.startswith("\rdecrypt "), repr(tty)
    assert (tmp_path / "dec").read_bytes() == src.read_bytes()


def test_no_progress_bar_when_quiet_or_piped(tmp_path):
    src = VECTORS / "big_plain.tensors"
    tty, out, rc = _cli_on_tty("verify", src, "--quiet")
    assert rc == 0 and "all hashes match" in out
    assert tty == ""
    tty, out, rc = _cli_on_tty("encrypt", src, tmp_path / "enc", "-q", "--new-keyfile", tmp_path / "k")
    assert rc == 0 and tty == ""
    r = _cli("verify", src)
    assert r.returncode == 0 and r.stderr == ""
    # A failure on a terminal: the bar (if drawn) is blanked, the message alone on its line.
    tty, out, rc = _cli_on_tty("verify", tmp_path / "missing")
    assert rc == 1 and tty.startswith("tensorizer verify: error: ") and "ETA" not in tty


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_redraws_are_throttled():
    import io

    from tensorizer._progress import Progress

    clock, out = _Clock(), io.StringIO()
    bar = Progress("copy", enabled=True, stream=out, interval=0.1, clock=clock)
    bar.update(0, 1000)
    for done in range(1, 500):  # all within one interval: no redraw
        bar.update(done)
    assert out.getvalue().count("\r") == 1
    clock.now += 1.0  # 500 bytes in 1 s
    bar.update(500)
    frames = out.getvalue().split("\r")[1:]
    assert len(frames) == 2
    assert " 50% [" in frames[1] and "500 B/1 kB" in frames[1]
    assert "500 B/s" in frames[1] and "ETA 0:01" in frames[1]
    clock.now += 0.01
    bar.update(900)  # too soon: not drawn...
    assert out.getvalue().count("\r") == 2
    bar.finish()  # ...but the end always is
    frames = out.getvalue().split("\r")[1:]
    assert len(frames) == 3 and "100% [" in frames[2] and "ETA 0:00" in frames[2]
    assert out.getvalue().endswith("\n")
    assert all(len(f.rstrip("\n")) < 80 for f in frames)


def test_progress_is_silent_when_disabled_and_blanks_itself_on_failure():
    import io

    from tensorizer._progress import Progress

    out = io.StringIO()  # not a terminal: disabled by default
    with Progress("verify", stream=out) as bar:
        bar.update(0, 10)
        bar.update(10)
    assert out.getvalue() == ""
    out = io.StringIO()
    with pytest.raises(OSError):
        with Progress("verify", stream=out, enabled=True, clock=_Clock()) as bar:
            bar.update(0, 10)
            raise OSError("disk gone")
    drawn = out.getvalue()
    assert drawn.endswith("\r") and drawn.split("\r")[-2].strip() == "" and "\n" not in drawn


def test_progress_callbacks_count_every_byte(tmp_path, monkeypatch):
    from tensorizer import _rewrite, _verify

    calls = []
    # Batches smaller than a tensor: one batch per tensor, one call after each.
    monkeypatch.setattr(_verify, "_BATCH_BYTES", 1000)
    monkeypatch.setattr(_rewrite, "_BATCH_BYTES", 1000)
    src = VECTORS / "big_plain.tensors"
    report = _verify.verify_file(src, progress=lambda done, total: calls.append((done, total)))
    total = report.bytes
    assert calls == [(0, total), (total - 12, total), (total, total)]  # "big", then "tail"
    calls.clear()
    _rewrite.rewrite(str(src), str(tmp_path / "copy"), progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, total), (total - 12, total), (total, total)]
