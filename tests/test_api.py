"""Python API behaviours of TensorSerializer / TensorDeserializer (FORMAT.md §8, §10; VECTORS.md I1-I7).

Every test here runs against upstream too (TZ_TEST_IMPL=upstream), except the
``ours_only`` ones, which check deliberate extensions.
"""

from __future__ import annotations

import collections.abc
import enum
import io
import types

import numpy
import pytest
import torch

import craft
import crosscases as cc
import tensorizer
from tz_impl import IMPL
from tensorizer import TensorDeserializer, TensorSerializer, TensorType

UPSTREAM = IMPL == "upstream"


# ---------------------------------------------------------------------------
# fixtures: small files written by the implementation under test


def write(path, *ops):
    s = TensorSerializer(str(path))
    try:
        for kind, arg in ops:
            if kind == "sd":
                s.write_state_dict(arg)
            elif kind == "module":
                s.write_module(arg)
    finally:
        s.close()
    return str(path)


@pytest.fixture
def flat_file(tmp_path):
    """Four plain tensors: float, int64, bool, bfloat16."""
    return write(
        tmp_path / "flat.tensors",
        (
            "sd",
            {
                "w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                "idx": torch.tensor([1, 2, 3], dtype=torch.int64),
                "mask": torch.tensor([True, False]),
                "bf": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
            },
        ),
    )


@pytest.fixture
def nested_file(tmp_path):
    return write(tmp_path / "nested.tensors", ("sd", cc.CASES["B6"](tensorizer)[0][1]))


@pytest.fixture
def module_file(tmp_path):
    m = cc.Nested()
    m.register_buffer("np", torch.full((2,), 3.0), persistent=False)
    return write(tmp_path / "module.tensors", ("module", m)), m


@pytest.fixture
def many_file(tmp_path):
    g = torch.Generator().manual_seed(3)
    tensors = {f"t{i:02d}": torch.randn(1 + 1000 * (i % 5), generator=g) for i in range(12)}
    return write(tmp_path / "many.tensors", ("sd", tensors)), tensors


def values(d):
    return {k: v for k, v in cc.walk(d)}


# ---------------------------------------------------------------------------
# I1 lazy vs eager


def test_i1_lazy_and_eager_same_values(flat_file):
    eager = TensorDeserializer(flat_file, device="cpu")
    lazy = TensorDeserializer(flat_file, device="cpu", lazy_load=True)
    try:
        assert list(eager.keys()) == list(lazy.keys()) == ["w", "idx", "mask", "bf"]
        for k in eager.keys():
            assert eager[k].dtype == lazy[k].dtype
            assert torch.equal(eager[k].data, lazy[k].data)
    finally:
        eager.close()
        lazy.close()


def test_i1_eager_closes_source_file_object(flat_file):
    f = open(flat_file, "rb")
    d = TensorDeserializer(f, device="cpu")
    assert f.closed
    assert torch.equal(d["w"].data, torch.arange(6, dtype=torch.float32).reshape(2, 3))
    f = open(flat_file, "rb")
    d = TensorDeserializer(f, device="cpu", lazy_load=True)
    assert not f.closed
    d.close()
    assert f.closed


def test_deserializer_context_manager(flat_file):
    f = open(flat_file, "rb")
    with TensorDeserializer(f, device="cpu", lazy_load=True) as d:
        assert d["idx"].tolist() == [1, 2, 3]
    assert f.closed


def test_device_argument_forms(flat_file):
    for dev in ("cpu", torch.device("cpu")):
        d = TensorDeserializer(flat_file, device=dev)
        assert all(v.device.type == "cpu" for v in d.values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda(flat_file):
    with pytest.raises(RuntimeError):
        TensorDeserializer(flat_file, device="cuda")


# ---------------------------------------------------------------------------
# I2 filter_func


def test_i2_filter_func_argument_types(nested_file):
    seen = []
    d = TensorDeserializer(nested_file, device="cpu", filter_func=lambda n: seen.append(n) or True)
    assert seen == [("model", "layer", 0, "weight"), ("model", "layer", 1, "weight"), "lm_head"]
    assert list(d.keys()) == ["model", "lm_head"]


def test_i2_filter_func_in_constructor_limits_keys(nested_file):
    d = TensorDeserializer(nested_file, device="cpu", filter_func=lambda n: n != "lm_head")
    assert list(d.keys()) == ["model"]
    assert "lm_head" not in d
    d = TensorDeserializer(nested_file, device="cpu", lazy_load=True, filter_func=lambda n: isinstance(n, str))
    assert [n for _, _, n, _ in d.read_tensors()] == ["lm_head"]


def test_i2_filter_func_per_call(nested_file):
    d = TensorDeserializer(nested_file, device="cpu", lazy_load=True)
    got = [n for _, _, n, _ in d.read_tensors(filter_func=lambda n: isinstance(n, tuple))]
    assert got == [("model", "layer", 0, "weight"), ("model", "layer", 1, "weight")]


# ---------------------------------------------------------------------------
# I3 read_tensors sequencing


def test_i3_read_tensors_continues(flat_file):
    d = TensorDeserializer(flat_file, device="cpu", lazy_load=True)
    first = [n for _, _, n, _ in d.read_tensors(num_tensors=2)]
    second = [n for _, _, n, _ in d.read_tensors(num_tensors=2)]
    assert (first, second) == (["w", "idx"], ["mask", "bf"])
    assert list(d.read_tensors()) == []


def test_i3_read_tensors_tuple_shape(flat_file):
    d = TensorDeserializer(flat_file, device="cpu", lazy_load=True)
    rows = list(d.read_tensors())
    assert [(int(i), t, n) for i, t, n, _ in rows] == [(0, TensorType.STATE_DICT, k) for k in ("w", "idx", "mask", "bf")]
    assert all(isinstance(t, torch.nn.Parameter) for *_, t in rows)


def test_i3_nothing_after_eager_load(flat_file):
    d = TensorDeserializer(flat_file, device="cpu")
    assert list(d.read_tensors()) == []
    assert list(d.read_tensors(num_tensors=2)) == []


def test_i3_continues_after_mapping_access(flat_file):
    d = TensorDeserializer(flat_file, device="cpu", lazy_load=True)
    d["idx"]
    assert [n for _, _, n, _ in d.read_tensors()] == ["mask", "bf"]


def test_i3_num_tensors_validation(flat_file):
    d = TensorDeserializer(flat_file, device="cpu", lazy_load=True)
    with pytest.raises(ValueError):
        list(d.read_tensors(num_tensors=-2))
    assert len(list(d.read_tensors(num_tensors=0))) == 0
    assert len(list(d.read_tensors(num_tensors=-1))) == 4


# ---------------------------------------------------------------------------
# I4 dtype, requires_grad, Parameters


def test_i4_dtype_cast(flat_file):
    d = TensorDeserializer(flat_file, device="cpu", dtype=torch.float16)
    assert d["w"].dtype == torch.float16 and d["w"].requires_grad
    assert d["idx"].dtype == torch.float16 and not d["idx"].requires_grad  # ints are cast too
    assert d["idx"].tolist() == [1.0, 2.0, 3.0]
    assert d["mask"].dtype == torch.bool  # bool is never cast
    assert d["bf"].dtype == torch.float16 and d["bf"].requires_grad
    assert all(isinstance(v, torch.nn.Parameter) for v in d.values())


def test_i4_dtype_cast_module_buffers(module_file):
    path, _ = module_file
    d = TensorDeserializer(path, device="cpu", dtype=torch.float16)
    assert d["sub.count"].dtype == torch.float16 and not d["sub.count"].requires_grad
    assert d[".buf"].dtype == torch.float16 and d[".buf"].requires_grad


def test_i4_requires_grad_from_source_dtype(flat_file):
    d = TensorDeserializer(flat_file, device="cpu")
    assert {k: v.requires_grad for k, v in d.items()} == {"w": True, "idx": False, "mask": False, "bf": True}


def test_i4_int_dtype_on_float_file(flat_file):
    with pytest.raises(RuntimeError):
        TensorDeserializer(flat_file, device="cpu", dtype=torch.int32)


def test_plaid_mode_accepted(flat_file):
    d = TensorDeserializer(flat_file, device="cpu", plaid_mode=True, plaid_mode_buffers=True)
    assert d["idx"].tolist() == [1, 2, 3]


# ---------------------------------------------------------------------------
# I5 readers and sources


@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_i5_num_readers_same_result(many_file, n):
    path, tensors = many_file
    one = values(TensorDeserializer(path, device="cpu", num_readers=1, verify_hash=True))
    several = values(TensorDeserializer(path, device="cpu", num_readers=n, verify_hash=True))
    assert list(one) == list(several) == [(k,) for k in tensors]
    for k, t in tensors.items():
        assert torch.equal(several[(k,)].data, t)


def test_i5_num_readers_lazy_and_filtered(many_file):
    path, tensors = many_file
    d = TensorDeserializer(path, device="cpu", num_readers=4, lazy_load=True, filter_func=lambda n: n[-1] in "13579")
    got = {n: t for _, _, n, t in d.read_tensors()}
    assert list(got) == [k for k in tensors if k[-1] in "13579"]
    for k, t in got.items():
        assert torch.equal(t.data, tensors[k])


def test_i5_bytesio_source(many_file):
    path, tensors = many_file
    with open(path, "rb") as f:
        data = f.read()
    d = TensorDeserializer(io.BytesIO(data), device="cpu", verify_hash=True)
    assert {k[0]: v for k, v in values(d).items()}.keys() == tensors.keys()
    d = TensorDeserializer(io.BytesIO(data), device="cpu", num_readers=1)
    assert len(d) == len(tensors)
    with pytest.raises(ValueError):
        TensorDeserializer(io.BytesIO(data), device="cpu", num_readers=2)


def test_i5_open_file_object_source(many_file):
    path, tensors = many_file
    with open(path, "rb") as f:
        d = TensorDeserializer(f, device="cpu", num_readers=2)
        assert len(d) == len(tensors)


def test_i5_pathlike_source(many_file, tmp_path):
    path, tensors = many_file
    import pathlib

    d = TensorDeserializer(pathlib.Path(path), device="cpu")
    assert len(d) == len(tensors)


@pytest.mark.parametrize("bad,exc", [(0, ValueError), (-1, ValueError), ("2", TypeError), (1.5, TypeError)])
def test_i5_num_readers_validation(flat_file, bad, exc):
    with pytest.raises(exc):
        TensorDeserializer(flat_file, device="cpu", num_readers=bad)


def test_text_mode_file_rejected(flat_file):
    with open(flat_file, "r") as f:
        with pytest.raises(ValueError):
            TensorDeserializer(f, device="cpu")


# ---------------------------------------------------------------------------
# I6 load_into_module


def test_i6_load_into_module(module_file):
    path, src = module_file
    dst = cc.Nested()
    for p in dst.parameters():
        p.data.zero_()
    d = TensorDeserializer(path, device="cpu")
    n = d.load_into_module(dst)
    assert n == 11
    assert torch.equal(dst.w.data, src.w.data)
    assert torch.equal(dst.sub.lin.weight.data, src.sub.lin.weight.data)
    assert torch.equal(dst.seq[2].bias.data, src.seq[2].bias.data)
    # buffers are registered as (persistent) buffers holding Parameter objects
    assert isinstance(dst.buf, torch.nn.Parameter) and "buf" in dict(dst.named_buffers(recurse=False))
    assert isinstance(dst.sub.count, torch.nn.Parameter) and dst.sub.count.tolist() == [5, 6, 7]
    assert "np" in dst.state_dict()  # the non-persistent buffer became persistent
    assert torch.equal(dst.np.data, torch.full((2,), 3.0))


def test_i6_load_into_module_filtered_lazy(module_file):
    path, src = module_file
    dst = cc.Nested()
    d = TensorDeserializer(path, device="cpu", lazy_load=True)
    assert d.load_into_module(dst, filter_func=lambda n: n.startswith("sub.")) == 4
    assert torch.equal(dst.sub.b.data, src.sub.b.data)


def test_i6_state_dict_file_not_loadable_into_module(flat_file):
    with pytest.raises(NotImplementedError):
        TensorDeserializer(flat_file, device="cpu").load_into_module(cc.Nested())


def test_i6_name_without_dot(tmp_path):
    s = TensorSerializer(str(tmp_path / "nodot.tensors"))
    s.write_tensor(0, "w", TensorType.PARAM, torch.ones(2))
    s.close()
    with pytest.raises(ValueError):
        TensorDeserializer(str(tmp_path / "nodot.tensors"), device="cpu").load_into_module(cc.Nested())


def test_i6_unknown_submodule(tmp_path):
    s = TensorSerializer(str(tmp_path / "unk.tensors"))
    s.write_tensor(0, "nope.w", TensorType.PARAM, torch.ones(2))
    s.close()
    with pytest.raises(KeyError):
        TensorDeserializer(str(tmp_path / "unk.tensors"), device="cpu").load_into_module(cc.Nested())


def test_i6_tied_weights_untied_after_load(tmp_path):
    path = write(tmp_path / "tied.tensors", ("module", cc.Tied()))
    dst = cc.Tied()
    TensorDeserializer(path, device="cpu").load_into_module(dst)
    assert torch.equal(dst.emb.weight.data, dst.head.weight.data)
    assert dst.emb.weight is not dst.head.weight


# ---------------------------------------------------------------------------
# I7 tree() and the Mapping interface


def test_i7_tree(nested_file):
    d = TensorDeserializer(nested_file, device="cpu", lazy_load=True)
    layer = d.tree(("model", "layer"))
    assert isinstance(layer, list) and len(layer) == 2 and isinstance(layer[0], dict)
    sentinel = object()
    assert d.tree(("nope",), default=sentinel) is sentinel
    assert d.tree(("nope",)) is None
    assert isinstance(d.tree(("lm_head",)), torch.Tensor)
    assert list(d.tree(["model"]).keys()) == ["layer"]
    with pytest.raises(TypeError):
        d.tree("model")
    with pytest.raises(TypeError):
        d.tree(0)
    full = d.tree()
    assert isinstance(full, dict) and list(full) == ["model", "lm_head"]
    assert isinstance(full["model"]["layer"], list)
    ref = cc.CASES["B6"](tensorizer)[0][1]
    assert torch.equal(full["model"]["layer"][1]["weight"].data, ref["model"]["layer"][1]["weight"])


def test_i7_tree_filter_func(nested_file):
    d = TensorDeserializer(nested_file, device="cpu", lazy_load=True)
    seen = []
    t = d.tree(filter_func=lambda n: seen.append(n) or n == "lm_head")
    assert list(t) == ["lm_head"]
    assert ("model", "layer", 0, "weight") in seen
    t = d.tree(("model",), filter_func=lambda n: isinstance(n, tuple) and n[2] == 1)
    assert len(t["layer"]) == 1


def test_mapping_interface(nested_file):
    d = TensorDeserializer(nested_file, device="cpu", lazy_load=True)
    assert isinstance(d, collections.abc.Mapping)
    assert list(d.keys()) == ["model", "lm_head"] == list(d)
    assert len(d) == 2
    assert "model" in d and "lm_head" in d
    assert ("model",) not in d and "layer" not in d
    assert d.get("nope") is None and d.get("nope", 7) == 7
    with pytest.raises(KeyError):
        d["nope"]
    model = d["model"]
    assert isinstance(model, types.MappingProxyType)
    assert isinstance(model["layer"], types.MappingProxyType)
    assert list(model["layer"].keys()) == [0, 1]
    assert isinstance(model["layer"][0]["weight"], torch.nn.Parameter)
    assert [k for k, _ in d.items()] == ["model", "lm_head"]
    vals = list(d.values())
    assert isinstance(vals[0], types.MappingProxyType) and isinstance(vals[1], torch.Tensor)


def test_mapping_top_level_list(tmp_path):
    path = write(tmp_path / "l.tensors", ("sd", [torch.ones(1), torch.zeros(2), torch.full((3,), 2.0)]))
    d = TensorDeserializer(path, device="cpu")
    assert list(d.keys()) == [0, 1, 2] and 1 in d and d[2].tolist() == [2.0, 2.0, 2.0]
    assert [t.shape[0] for t in d.tree()] == [1, 2, 3]


# ---------------------------------------------------------------------------
# read_numpy_arrays (C12)


def test_read_numpy_arrays_opaque(flat_file):
    d = TensorDeserializer(flat_file, device="cpu", lazy_load=True)
    with pytest.raises(ValueError):
        list(d.read_numpy_arrays())
    d = TensorDeserializer(flat_file, device="cpu", lazy_load=True)
    rows = list(d.read_numpy_arrays(allow_raw_data=True))
    assert [r[2] for r in rows] == ["w", "idx", "mask", "bf"]
    idx, ttype, name, arr, opaque, tdt = rows[3]
    assert (int(idx), ttype, opaque, tdt) == (0, TensorType.STATE_DICT, True, "torch.bfloat16")
    assert arr.dtype == numpy.int16 and arr.shape == (2,)
    assert torch.equal(torch.from_numpy(arr.copy()).view(torch.bfloat16), torch.tensor([1.5, -2.0], dtype=torch.bfloat16))
    _, _, _, arr, opaque, tdt = rows[0]
    assert arr.dtype == numpy.float32 and not opaque and tdt is None
    assert numpy.array_equal(arr, numpy.arange(6, dtype=numpy.float32).reshape(2, 3))


def test_read_numpy_arrays_plain_no_raw_needed(tmp_path):
    path = write(tmp_path / "p.tensors", ("sd", {"a": torch.arange(3), "b": torch.ones(2, dtype=torch.float64)}))
    d = TensorDeserializer(path, device="cpu", lazy_load=True)
    rows = list(d.read_numpy_arrays(num_tensors=1))
    assert len(rows) == 1 and rows[0][3].tolist() == [0, 1, 2]
    rows = list(d.read_numpy_arrays())
    assert [r[2] for r in rows] == ["b"]


# ---------------------------------------------------------------------------
# verify_module (F7)


def test_verify_module(module_file):
    path, src = module_file
    d = TensorDeserializer(path, device="cpu")
    ok, results = d.verify_module(src)
    res = dict(results)
    for name in ("sub.b", "sub.count", "sub.lin.weight", "sub.lin.bias", "seq.0.weight", "seq.2.bias"):
        assert res[name] is True, name
    if UPSTREAM:
        assert res[".w"] is False and not ok  # root names never match state_dict() names upstream
    other = cc.Nested()
    other.sub.lin.weight.data.add_(1)
    ok2, results2 = d.verify_module(other)
    assert not ok2 and dict(results2)["sub.lin.weight"] is False and dict(results2)["sub.b"] is True


def test_verify_module_needs_loaded_tensors(module_file):
    path, src = module_file
    d = TensorDeserializer(path, device="cpu", lazy_load=True)
    with pytest.raises(RuntimeError):
        d.verify_module(src)


# ---------------------------------------------------------------------------
# TensorSerializer


@pytest.mark.ours_only
def test_serializer_context_manager(tmp_path):
    p = tmp_path / "cm.tensors"
    with TensorSerializer(str(p)) as s:
        s.write_state_dict({"a": torch.ones(2)})
    assert p.read_bytes() == craft.simple_file({"a": torch.ones(2)}).to_bytes()
    assert TensorDeserializer(str(p), device="cpu")["a"].tolist() == [1.0, 1.0]


def test_serializer_total_tensor_bytes(tmp_path):
    p = tmp_path / "t.tensors"
    s = TensorSerializer(str(p))
    s.write_state_dict({"m": torch.empty((3, 4), device="meta"), "r": torch.ones(2), "x": torch.zeros(3, dtype=torch.int64)})
    assert s.total_tensor_bytes == 32
    s.close()
    d = TensorDeserializer(str(p), device="cpu", lazy_load=True)
    assert d.total_tensor_bytes == 48 + 8 + 24  # allocation sizes, meta included
    assert d.total_file_bytes == 32
    d = TensorDeserializer(str(p), device="cpu")
    assert d.total_tensor_bytes == 32  # after an eager load: data lengths
    assert d.total_bytes_read >= 32
    assert d.read_bytes == 0 and d.total_compressed_tensor_bytes == 0


def test_serializer_bytesio_and_file_object(tmp_path):
    buf = io.BytesIO()
    s = TensorSerializer(buf)
    s.write_state_dict({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3)})
    data = buf.getvalue()
    import hashlib

    assert hashlib.sha256(data).hexdigest() == "668e9705131715375605e91e604d186cd362a73286f4c1d99d0e57834a2ab291"
    s.close()
    with open(tmp_path / "f.tensors", "wb+") as f:
        s = TensorSerializer(f)
        s.write_state_dict({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3)})
        s.close()
    assert (tmp_path / "f.tensors").read_bytes() == data


def test_serializer_creates_parent_dirs(tmp_path):
    p = tmp_path / "a" / "b" / "c.tensors"
    s = TensorSerializer(str(p))
    s.write_state_dict({"x": torch.ones(1)})
    s.close()
    assert TensorDeserializer(str(p), device="cpu")["x"].tolist() == [1.0]


def test_write_module_remove_tensors(tmp_path):
    m = cc.Nested()
    ref = {k: v.clone() for k, v in m.state_dict().items()}
    p = tmp_path / "rm.tensors"
    s = TensorSerializer(str(p))
    s.write_module(m, remove_tensors=True)
    s.close()
    assert m.w is None and m.buf is None and m.sub.lin.weight is None and m.seq[0].bias is None
    d = TensorDeserializer(str(p), device="cpu")
    assert torch.equal(d["sub.lin.weight"].data, ref["sub.lin.weight"])
    assert torch.equal(d[".w"].data, ref["w"])


def test_write_module_include_non_persistent_buffers(tmp_path):
    m = cc.NonPersistent()
    for flag, want in ((True, {".dropped", "inner.tmp"}), (False, set())):
        p = tmp_path / f"np{flag}.tensors"
        s = TensorSerializer(str(p))
        s.write_module(m, include_non_persistent_buffers=flag)
        s.close()
        keys = set(TensorDeserializer(str(p), device="cpu").keys())
        assert {"lin.weight", "lin.bias", "inner.stat", "inner.kept"} <= keys
        assert keys & {".dropped", "inner.tmp"} == want


def test_write_module_root_buffers_without_non_persistent(tmp_path):
    """Persistent *root* buffers with include_non_persistent_buffers=False.

    Upstream compares named_buffers() names ("kept") with its own labels
    (".kept") and so drops every root buffer; ours keeps persistent ones.
    """
    m = torch.nn.Module()
    m.register_buffer("kept", torch.ones(2))
    m.register_buffer("gone", torch.zeros(2), persistent=False)
    m.lin = torch.nn.Linear(2, 2)
    p = tmp_path / "rootbuf.tensors"
    s = TensorSerializer(str(p))
    s.write_module(m, include_non_persistent_buffers=False)
    s.close()
    keys = list(TensorDeserializer(str(p), device="cpu").keys())
    if UPSTREAM:
        assert keys == ["lin.weight", "lin.bias"]
    else:
        assert keys == [".kept", "lin.weight", "lin.bias"]


def test_write_state_dict_type_errors(tmp_path):
    s = TensorSerializer(str(tmp_path / "x.tensors"))
    try:
        with pytest.raises(TypeError):
            s.write_state_dict({1: torch.ones(1)})
        with pytest.raises(TypeError):
            s.write_state_dict({"a": 5})
    finally:
        s.close()


def test_write_conflicting_paths(tmp_path):
    s = TensorSerializer(str(tmp_path / "x.tensors"))
    try:
        s.write_state_dict({"a": {"b": torch.ones(1)}})
        with pytest.raises(ValueError):
            s.write_state_dict({"a": torch.ones(1)})
        with pytest.raises(ValueError):
            s.write_state_dict({"a": {"b": torch.ones(1)}})
    finally:
        s.close()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_write_quantized_refused(tmp_path):
    s = TensorSerializer(str(tmp_path / "q.tensors"))
    try:
        with pytest.raises(NotImplementedError):
            s.write_state_dict({"q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)})
    finally:
        s.close()


def test_write_limits_name_and_index(tmp_path):
    """B18 / D8: a 65535-byte name and module index 65535 work; one more does not."""
    import struct

    p = tmp_path / "lim.tensors"
    s = TensorSerializer(str(p))
    long_name = "a." + "x" * 65533
    s.write_tensor(65535, long_name, TensorType.PARAM, torch.ones(1))
    with pytest.raises((struct.error, ValueError, OverflowError)):
        s.write_tensor(0, "b." + "x" * 65534, TensorType.PARAM, torch.ones(1))
    with pytest.raises((struct.error, ValueError, OverflowError)):
        s.write_tensor(65536, "c.d", TensorType.PARAM, torch.ones(1))
    s.close()
    d = TensorDeserializer(str(p), device="cpu", lazy_load=True)
    rows = list(d.read_tensors())
    assert [(int(i), n) for i, _, n, _ in rows][0] == (65535, long_name)


def _overflow_dict(n=100, width=2700, prefix="n"):
    return {f"{prefix}{i:04d}" + "x" * width: torch.ones(1) for i in range(n)}


def test_metadata_overflow_on_later_call(tmp_path):
    """The 256 KiB reserve is fixed once tensors were written: a later call that overflows it fails."""
    s = TensorSerializer(str(tmp_path / "ov.tensors"))
    try:
        s.write_state_dict({"a": torch.ones(1)})
        with pytest.raises(RuntimeError):
            s.write_state_dict(_overflow_dict())
    finally:
        try:
            s.close()
        except Exception:  # noqa: BLE001 - the file is inconsistent after the error
            pass


@pytest.mark.ours_only
def test_metadata_beyond_256k_on_first_call(tmp_path, upstream):
    """Ours sizes the reserve to a first write call's metadata (upstream raises RuntimeError)."""
    p = tmp_path / "big_meta.tensors"
    tensors = _overflow_dict()
    s = TensorSerializer(str(p))
    s.write_state_dict(tensors)
    s.close()
    data = p.read_bytes()
    tz, lay = craft.parse(data)
    assert lay.metadata_len > 262144 and lay.tensor_count == len(tensors)
    d = TensorDeserializer(str(p), device="cpu", verify_hash=True)
    assert list(d.keys()) == list(tensors)
    out = upstream.run_upstream_json(
        """
        import sys, json, tensorizer
        d = tensorizer.TensorDeserializer(sys.argv[1], device="cpu", verify_hash=True)
        print(json.dumps([len(d), float(sum(t.sum() for t in d.values()))]))
        """,
        args=[p],
    )
    assert out == [len(tensors), float(len(tensors))]


def test_serializer_file_obj_validation(tmp_path):
    with open(tmp_path / "ro.tensors", "wb") as f:
        f.write(b"x")
    with open(tmp_path / "ro.tensors", "rb") as f:
        with pytest.raises(ValueError):
            TensorSerializer(f)


# ---------------------------------------------------------------------------
# module-level API


def test_version_constants():
    ser = tensorizer.serialization
    assert ser.NON_OPAQUE_TENSORIZER_VERSION == 1
    assert ser.OPAQUE_TENSORIZER_VERSION == 2
    assert ser.ENCRYPTION_TENSORIZER_VERSION == 3
    assert ser.META_TENSOR_TENSORIZER_VERSION == 4
    assert ser.LONG_TENSOR_TENSORIZER_VERSION == 5
    assert ser.TENSORIZER_VERSION == 5
    assert ser.TENSORIZER_MAGIC == b"|TZR|"
    assert ser.OPAQUE_DTYPE_SEP == "\0"
    assert issubclass(ser.HashMismatchError, Exception)


def test_enums():
    assert issubclass(TensorType, enum.IntEnum)
    assert (TensorType.PARAM, TensorType.BUFFER, TensorType.STATE_DICT) == (0, 1, 2)
    assert TensorType(1) is TensorType.BUFFER
    HashType = tensorizer.serialization.HashType
    assert (HashType.CRC32, HashType.SHA256) == (0, 1)


def test_public_names():
    for name in ("TensorSerializer", "TensorDeserializer", "TensorType", "stream_io", "utils", "serialization"):
        assert hasattr(tensorizer, name), name
    assert isinstance(tensorizer.__version__, str)


def test_utils_convert_bytes():
    cb = tensorizer.utils.convert_bytes
    assert cb(1536, decimal=False) == "1.5 KiB"
    assert cb(1500) == "1.5 KB"
    assert cb(999) == "999.0 bytes"
    assert cb(0) == "0.0 bytes"
    assert cb(2 * 1024**3, decimal=False) == "2.0 GiB"
    assert cb(3 * 10**12) == "3.0 TB"


def test_utils_get_mem_usage():
    s = tensorizer.utils.get_mem_usage()
    assert isinstance(s, str) and s.startswith("CPU:") and "maxrss" in s


def test_utils_no_init_or_tensor():
    no_init = tensorizer.utils.no_init_or_tensor
    with no_init():
        lin = torch.nn.Linear(3, 3)
        assert torch.empty(2).is_meta
    assert lin.weight.is_meta
    assert not torch.empty(2).is_meta
    m = no_init(lambda: torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2), torch.nn.Embedding(3, 2)))
    assert all(p.is_meta for p in m.parameters())
    with pytest.raises(TypeError):
        no_init(5)


def test_meta_module_written_and_loaded(tmp_path):
    """E2 through the API: a no_init module serializes to v4 and loads as zeros."""
    m = tensorizer.utils.no_init_or_tensor(lambda: torch.nn.Linear(4, 3))
    p = tmp_path / "meta.tensors"
    s = TensorSerializer(str(p))
    s.write_module(m)
    s.close()
    assert craft.layout(p.read_bytes()).version == 4
    dst = torch.nn.Linear(4, 3)
    TensorDeserializer(str(p), device="cpu", verify_hash=True).load_into_module(dst)
    assert not dst.weight.detach().any() and dst.weight.shape == (3, 4)


def test_the_private_file_header_reads_as_upstreams(tmp_path):
    # Upstream users (and upstream's own tests) read TensorDeserializer._file_header.
    from tensorizer import DecryptionParams, EncryptionParams
    from tensorizer._crypt import available

    assert available is True
    plain, enc = tmp_path / "plain.tensors", tmp_path / "enc.tensors"
    sd = {"a": torch.arange(3), "b": torch.ones(2, 2)}
    s = TensorSerializer(plain)
    s.write_state_dict(sd)
    s.close()
    key = EncryptionParams.random()
    s = TensorSerializer(enc, encryption=key)
    s.write_state_dict(sd)
    s.close()
    with TensorDeserializer(plain, lazy_load=True) as t:
        h = t._file_header
        assert h.tensor_count == 2
        assert h.tensor_size == t.total_file_bytes
        assert h.feature_flags == 0
        assert h.version_number >= 1
        from tensorizer.serialization import _FileFeatureFlags

        assert _FileFeatureFlags.encrypted not in t._file_flags
    with TensorDeserializer(enc, lazy_load=True, encryption=DecryptionParams.from_key(key.key)) as t:
        # Data version 3 marks encryption; the feature flags exist from version 4 on.
        assert t._file_header.version_number >= 3
