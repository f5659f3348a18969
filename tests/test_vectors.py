"""The stored conformance vectors (tests/vectors/, written by upstream 2.11.1).

Every file must decode with our ``TensorDeserializer`` to its
``manifest.json`` entry: names (structured paths joined with "."), dtype
names, shapes and the SHA-256 of each tensor's raw bytes.  Meta tensors must
come back as zeros.  Hash verification must pass.

The encrypted vectors are opened with the key or password from the manifest.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

import craft
import tensorizer

VECTORS = Path(__file__).resolve().parent / "vectors"
MANIFEST = json.loads((VECTORS / "manifest.json").read_text())
NAMES = sorted(k for k in MANIFEST if not k.startswith("_"))
ENCRYPTED = [n for n in NAMES if "key_hex" in MANIFEST[n] or "password" in MANIFEST[n]]
PLAIN = [n for n in NAMES if n not in ENCRYPTED]


def _raw(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes()


def _flat_name(path) -> str:
    if isinstance(path, str):
        return path
    return ".".join(str(c) for c in path)


def _walk(mapping, prefix=()):
    for k in mapping.keys():
        v = mapping[k]
        if isinstance(v, torch.Tensor):
            yield prefix + (k,), v
        else:
            yield from _walk(v, prefix + (k,))


def _check(name: str, loaded: dict):
    want = MANIFEST[name]["tensors"]
    assert sorted(loaded) == sorted(want)
    for tname, spec in want.items():
        t = loaded[tname]
        assert isinstance(t, torch.Tensor)
        assert str(t.dtype) == "torch." + spec["dtype"], tname
        assert list(t.shape) == spec["shape"], tname
        assert t.device.type == "cpu"
        raw = _raw(t)
        if spec["meta"]:
            assert raw == bytes(len(raw)), f"{tname}: meta tensor must load as zeros"
            assert len(raw) == t.numel() * t.element_size()
        else:
            assert hashlib.sha256(raw).hexdigest() == spec["sha256"], tname


def _decryption(name):
    DecryptionParams = tensorizer.DecryptionParams
    spec = MANIFEST[name]
    if "key_hex" in spec:
        return DecryptionParams.from_key(bytes.fromhex(spec["key_hex"]))
    return DecryptionParams.from_string(spec["password"])


def _load_kwargs(name):
    return {"encryption": _decryption(name)} if name in ENCRYPTED else {}


def test_vectors_present():
    assert NAMES, "manifest.json lists no vectors"
    for n in NAMES:
        assert (VECTORS / f"{n}.tensors").is_file(), n
    assert set(PLAIN) >= {"v1_plain", "v2_opaque", "v4_meta", "structured", "module", "big_plain"}
    assert set(ENCRYPTED) == {"big_enc", "enc_password", "enc_random"}


@pytest.mark.parametrize("name", NAMES)
def test_vector_eager_verified(name):
    kw = _load_kwargs(name)
    d = tensorizer.TensorDeserializer(str(VECTORS / f"{name}.tensors"), device="cpu", verify_hash=True, **kw)
    try:
        loaded = {_flat_name(p): t for p, t in _walk(d)}
    finally:
        d.close()
    _check(name, loaded)


@pytest.mark.parametrize("name", NAMES)
def test_vector_lazy_read_tensors(name):
    kw = _load_kwargs(name)
    path = VECTORS / f"{name}.tensors"
    d = tensorizer.TensorDeserializer(str(path), device="cpu", lazy_load=True, verify_hash=True, **kw)
    try:
        items = list(d.read_tensors())
    finally:
        d.close()
    loaded = {_flat_name(n): t for _, _, n, t in items}
    _check(name, loaded)
    # file order, module index and tensor type agree with the raw records
    tzf, _ = craft.parse(path.read_bytes())
    assert len(items) == len(tzf.records)
    for (idx, ttype, _n, _t), rec in zip(items, tzf.records):
        assert (int(idx), int(ttype)) == (rec.module_idx, rec.tensor_type)
        assert isinstance(ttype, tensorizer.TensorType)


@pytest.mark.parametrize("name", PLAIN)
def test_vector_plain_no_verification(name):
    d = tensorizer.TensorDeserializer(str(VECTORS / f"{name}.tensors"), device="cpu")
    _check(name, {_flat_name(p): t for p, t in _walk(d)})


@pytest.mark.parametrize("name", PLAIN)
def test_vector_hashes_recompute(name):
    """F1: an independent recomputation of every stored CRC32/SHA-256 matches."""
    data = (VECTORS / f"{name}.tensors").read_bytes()
    results = craft.verify_record_hashes(data)
    assert results and all(ok for _, ok in results)


@pytest.mark.parametrize("name", NAMES)
def test_vector_key_order(name):
    """keys() lists top-level names in file order of first appearance."""
    path = VECTORS / f"{name}.tensors"
    tzf, _ = craft.parse(path.read_bytes())
    order = []
    for r in tzf.records:
        if r.name.startswith(b"\x1e"):
            first = json.loads(r.name[1:].decode())[0]
        else:
            first = r.name.decode()
        if first not in order:
            order.append(first)
    kw = _load_kwargs(name)
    d = tensorizer.TensorDeserializer(str(path), device="cpu", lazy_load=True, **kw)
    try:
        assert list(d.keys()) == order
        assert len(d) == len(order)
    finally:
        d.close()


def test_vector_module_load_into_module():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 4))
    d = tensorizer.TensorDeserializer(str(VECTORS / "module.tensors"), device="cpu", verify_hash=True)
    n = d.load_into_module(m)
    assert n == 9
    want = MANIFEST["module"]["tensors"]
    sd = m.state_dict()
    for k, spec in want.items():
        assert hashlib.sha256(_raw(sd[k])).hexdigest() == spec["sha256"], k


def test_vector_v4_meta_verify_hash():
    """E6: meta tensors are not verified during loading; the file loads with verification on."""
    d = tensorizer.TensorDeserializer(str(VECTORS / "v4_meta.tensors"), device="cpu", verify_hash=True)
    assert d["m"].shape == (10, 3) and not d["m"].detach().any()


def test_vector_v2_opaque_numpy_view():
    """C12 on the stored vector: raw int16 data plus the torch dtype name."""
    d = tensorizer.TensorDeserializer(str(VECTORS / "v2_opaque.tensors"), device="cpu", lazy_load=True)
    rows = {n: rest for _i, _t, n, *rest in d.read_numpy_arrays(allow_raw_data=True)}
    arr, opaque, tdt = rows["bf16"]
    assert arr.dtype.str == "<i2" and arr.shape == (31, 17) and opaque and tdt == "torch.bfloat16"
    arr, opaque, tdt = rows["f32"]
    assert arr.dtype.str == "<f4" and not opaque and tdt is None
