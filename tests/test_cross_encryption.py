"""Live cross tests of encrypted files with upstream tensorizer 2.12.1.

* upstream encrypts (random key, exact key, password; with a meta tensor)
  -> our reader decrypts with ``verify_hash=True`` and gets the same tensors;
* we encrypt (exact key, password, random key; chunk boundaries 2097152 and
  2097153 bytes and a 3-chunk tensor, a meta tensor, bf16, empty tensors)
  -> upstream's reader decrypts with ``verify_hash=True`` and gets them;
* a wrong key fails with ``CryptographyError`` on both sides.

Tensors come from ``craft_crypto.cross_tensors`` (deterministic, importable
in both processes) and are compared as dtype, shape and SHA-256 of the raw
bytes.  All upstream work runs in one subprocess per module (the ``cross``
fixture), since starting one costs ~2 s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import craft_crypto as cc
import tensorizer

EP = tensorizer.EncryptionParams
DP = tensorizer.DecryptionParams
CryptographyError = tensorizer.CryptographyError

KEY = bytes(range(32))
WRONG_KEY = bytes(range(1, 33))
PASSWORD = "cross-hunter2"
SALT = b"cross-salt-16byt"

# our writes: case -> how the EncryptionParams are made
OURS = {
    "ours_key": {"key_hex": KEY.hex()},
    "ours_password": {"password": PASSWORD, "salt_hex": SALT.hex()},
    "ours_random": {"random": True},
    "ours_meta": {"key_hex": KEY.hex()},
    "ours_bf16": {"key_hex": KEY.hex()},
    "ours_empty": {"key_hex": KEY.hex()},
}
# upstream's writes
UP = {
    "up_random": {"random": True},
    "up_key": {"key_hex": KEY.hex()},
    "up_password": {"password": PASSWORD, "salt_hex": SALT.hex()},
    "up_meta": {"key_hex": KEY.hex()},
}

_UPSTREAM_CODE = r"""
import json, sys, traceback
import craft_crypto as cc
from tensorizer import TensorSerializer, TensorDeserializer, EncryptionParams as EP, DecryptionParams as DP

spec = json.load(open(sys.argv[1]))
out = {"write": {}, "read": {}}


def enc_params(how):
    if how.get("random"):
        return EP.random()
    if "key_hex" in how:
        return EP(bytes.fromhex(how["key_hex"]))
    return EP.from_string(how["password"], opslimit=EP.OpsLimit.MIN, memlimit=EP.MemLimit.MIN,
                          salt=bytes.fromhex(how["salt_hex"]))


def dec_params(how):
    if "key_hex" in how:
        return DP.from_key(bytes.fromhex(how["key_hex"]))
    return DP.from_string(how["password"])


for case, path, how in spec["write"]:
    try:
        ep = enc_params(how)
        s = TensorSerializer(path, encryption=ep)
        s.write_state_dict(cc.cross_tensors(case))
        s.close()
        out["write"][case] = {"ok": True, "key_hex": ep.key.hex()}
    except Exception as e:
        out["write"][case] = {"ok": False, "error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()}

for label, path, how in spec["read"]:
    try:
        with TensorDeserializer(path, device="cpu", encryption=dec_params(how), verify_hash=True) as d:
            desc = cc.describe_tensors(d)
        out["read"][label] = {"ok": True, "desc": desc}
    except Exception as e:
        out["read"][label] = {"ok": False, "error_type": type(e).__name__, "error": str(e),
                              "tb": traceback.format_exc()}

json.dump(out, open(sys.argv[2], "w"))
"""


class Cross:
    def __init__(self, root: Path):
        self.root = root
        self.ours_keys = {}  # case -> key bytes, or error string
        self.up = {}

    def path(self, case) -> Path:
        return self.root / f"{case}.tensors"


def _our_params(how):
    if how.get("random"):
        return EP.random()
    if "key_hex" in how:
        return EP(bytes.fromhex(how["key_hex"]))
    return EP.from_string(
        how["password"], opslimit=EP.OpsLimit.MIN, memlimit=EP.MemLimit.MIN, salt=bytes.fromhex(how["salt_hex"])
    )


def _reads(case, key: bytes):
    """[(label, decryption spec)] upstream should do on our file ``case``."""
    out = [(case, {"key_hex": key.hex()})]
    if case == "ours_password":
        out = [(case, {"password": PASSWORD}), (case + ":key", {"key_hex": key.hex()})]
    if case == "ours_key":
        out.append((case + ":wrong", {"key_hex": WRONG_KEY.hex()}))
    return out


@pytest.fixture(scope="module")
def cross(tmp_path_factory, upstream) -> Cross:
    c = Cross(tmp_path_factory.mktemp("cross_enc"))
    # 1. our writer, in this process
    for case, how in OURS.items():
        try:
            ep = _our_params(how)
            s = tensorizer.TensorSerializer(str(c.path(case)), encryption=ep)
            s.write_state_dict(cc.cross_tensors(case))
            s.close()
            c.ours_keys[case] = bytes(ep.key)
        except Exception as e:  # noqa: BLE001
            c.ours_keys[case] = f"{type(e).__name__}: {e}"
    # 2. upstream writes its files, then reads ours
    spec = {"write": [[case, str(c.path(case)), how] for case, how in UP.items()], "read": []}
    for case, key in c.ours_keys.items():
        if isinstance(key, bytes):
            spec["read"] += [[label, str(c.path(case)), how] for label, how in _reads(case, key)]
    (c.root / "spec.json").write_text(json.dumps(spec))
    upstream.run_upstream(_UPSTREAM_CODE, args=[c.root / "spec.json", c.root / "result.json"], cwd=c.root)
    c.up = json.loads((c.root / "result.json").read_text())
    return c


def _our_describe(path, dp) -> dict:
    with tensorizer.TensorDeserializer(str(path), device="cpu", encryption=dp, verify_hash=True) as d:
        return cc.describe_tensors(d)


# ---------------------------------------------------------------------------
# upstream encrypts -> we decrypt


@pytest.mark.parametrize(
    "case,how", [(c, "key") for c in UP] + [(c, "password") for c in UP if "password" in UP[c]]
)
def test_ours_decrypts_upstream(cross, case, how):
    res = cross.up["write"][case]
    assert res["ok"], f"upstream failed to write {case}: {res['error']}\n{res['tb']}"
    if how == "password":
        dp = DP.from_string(PASSWORD)
    else:
        dp = DP.from_key(bytes.fromhex(res["key_hex"]))
    want = cc.describe_tensors(cc.cross_tensors(case))
    assert _our_describe(cross.path(case), dp) == want


def test_upstream_file_layout(cross):
    """What we decrypt really is upstream's chunked, nonce-incremented format."""
    res = cross.up["write"]["up_random"]
    assert res["ok"], res.get("tb")
    data = cross.path("up_random").read_bytes()
    recs = cc.by_name(data)
    assert [recs[n].cipher().mac_count for n in ("small", "one_chunk", "two_chunks")] == [1, 1, 2]
    key = bytes.fromhex(res["key_hex"])
    want = cc.cross_tensors("up_random")["two_chunks"].numpy().tobytes()
    assert cc.decrypt_record(recs["two_chunks"], data, key) == want
    assert cc.header_version_flags(cross.path("up_meta").read_bytes()) == (4, 1)


def test_ours_rejects_wrong_key_on_upstream_file(cross):
    assert cross.up["write"]["up_key"]["ok"]
    with pytest.raises(CryptographyError):
        _our_describe(cross.path("up_key"), DP.from_key(WRONG_KEY))
    with pytest.raises(CryptographyError):
        _our_describe(cross.path("up_password"), DP.from_string(PASSWORD + "x"))


# ---------------------------------------------------------------------------
# we encrypt -> upstream decrypts


def _check_upstream_read(cross, case, label):
    key = cross.ours_keys[case]
    assert isinstance(key, bytes), f"our writer failed on {case}: {key}"
    res = cross.up["read"][label]
    assert res["ok"], f"upstream could not decrypt our {case} ({label}): {res['error']}\n{res['tb']}"
    assert res["desc"] == cc.describe_tensors(cc.cross_tensors(case))


@pytest.mark.parametrize(
    "case,label",
    [
        ("ours_key", "ours_key"),
        ("ours_password", "ours_password"),
        ("ours_password", "ours_password:key"),
        ("ours_random", "ours_random"),
        ("ours_meta", "ours_meta"),
        ("ours_bf16", "ours_bf16"),
    ],
)
def test_upstream_decrypts_ours(cross, case, label):
    _check_upstream_read(cross, case, label)


@pytest.mark.ours_only  # upstream's writer cannot write empty tensors with encryption
def test_upstream_decrypts_our_empty_tensors(cross):
    _check_upstream_read(cross, "ours_empty", "ours_empty")


def test_our_files_are_what_we_claim(cross):
    """Chunk counts at the boundaries, versions (so the cases above test what they say)."""
    assert isinstance(cross.ours_keys["ours_key"], bytes), cross.ours_keys["ours_key"]
    recs = cc.by_name(cross.path("ours_key").read_bytes())
    assert [recs[n].cipher().mac_count for n in ("small", "one_chunk", "two_chunks", "three_chunks")] == [1, 1, 2, 3]
    assert cc.header_version_flags(cross.path("ours_meta").read_bytes()) == (4, 1)
    assert cc.header_version_flags(cross.path("ours_bf16").read_bytes()) == (3, 0)
    assert cc.by_name(cross.path("ours_password").read_bytes())["w"].kdf().salt == SALT


def test_upstream_rejects_wrong_key_on_our_file(cross):
    assert isinstance(cross.ours_keys["ours_key"], bytes), cross.ours_keys["ours_key"]
    res = cross.up["read"]["ours_key:wrong"]
    assert not res["ok"]
    assert res["error_type"] == "CryptographyError", res["tb"]
