"""Round trips through the native library (skipped when it is not built)."""

import hashlib
import io
import os
import struct
import types

import numpy
import pytest
import torch

from tensorizer import (  # noqa: E402
    CryptographyError,
    TensorDeserializer,
    TensorSerializer,
    TensorType,
)
from tensorizer import serialization  # noqa: E402


class KeepingBytesIO(io.BytesIO):
    """A BytesIO that remembers its contents when closed."""

    final = None

    def close(self):
        if not self.closed:
            self.final = self.getvalue()
        super().close()


def write_sd(path, sd):
    s = TensorSerializer(path)
    s.write_state_dict(sd)
    s.close()


def sample_state_dict():
    g = torch.Generator().manual_seed(0)
    return {
        "f32": torch.randn(4, 5, generator=g),
        "f16": torch.randn(3, generator=g).half(),
        "bf16": torch.randn(7, generator=g).to(torch.bfloat16),
        "c64": torch.randn(2, 2, dtype=torch.complex64, generator=g),
        "c32": torch.randn(3, generator=g).to(torch.complex32),
        "f8": torch.randn(6, generator=g).to(torch.float8_e4m3fn),
        "i64": torch.arange(10),
        "u16": torch.arange(5).to(torch.uint16),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.zeros(0, 4, dtype=torch.float16),
        "transposed": torch.arange(6, dtype=torch.int32).reshape(2, 3).t(),
        "meta": torch.empty(3, 2, device="meta"),
    }


def raw_bytes(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(raw_bytes(a), raw_bytes(b))


def test_worked_example_is_byte_identical(tmp_path):
    # FORMAT.md §4.9
    p = tmp_path / "ex.tensors"
    write_sd(str(p), {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3)})
    data = p.read_bytes()
    assert len(data) == 262327
    assert (
        hashlib.sha256(data).hexdigest()
        == "668e9705131715375605e91e604d186cd362a73286f4c1d99d0e57834a2ab291"
    )


def test_state_dict_roundtrip(tmp_path):
    p = str(tmp_path / "sd.tensors")
    sd = sample_state_dict()
    write_sd(p, sd)
    with TensorDeserializer(p, device="cpu", verify_hash=True) as d:
        assert list(d.keys()) == list(sd.keys())
        assert len(d) == len(sd)
        for k, v in sd.items():
            got = d[k]
            assert isinstance(got, torch.nn.Parameter)
            assert got.device.type == "cpu"
            if v.is_meta:
                assert got.shape == v.shape and got.dtype == v.dtype
                assert torch.count_nonzero(raw_bytes(got)) == 0
            else:
                assert_same(v, got)
            assert got.requires_grad == (v.dtype.is_floating_point or v.dtype.is_complex)


def test_versions(tmp_path):
    def version_of(sd):
        p = str(tmp_path / "v.tensors")
        write_sd(p, sd)
        with open(p, "rb") as f:
            f.seek(5)
            return struct.unpack("<I", f.read(4))[0]

    assert version_of({"a": torch.ones(1)}) == 1
    assert version_of({"a": torch.ones(1, dtype=torch.bfloat16)}) == 2
    assert version_of({"a": torch.ones(1, device="meta")}) == 4


def test_nested_structures(tmp_path):
    p = str(tmp_path / "nested.tensors")
    t = [torch.full((2,), float(i)) for i in range(5)]
    sd = {
        "model": {"layer": [{"weight": t[0]}, {"weight": t[1]}]},
        "lm_head": t[2],
        "uni\u00e9": {"k\U0001F600": t[3]},
    }
    write_sd(p, sd)
    d = TensorDeserializer(p, device="cpu")
    assert list(d.keys()) == ["model", "lm_head", "uni\u00e9"]
    assert ("model",) not in d
    model = d["model"]
    assert isinstance(model, types.MappingProxyType)
    assert list(model["layer"].keys()) == [0, 1]
    assert torch.equal(model["layer"][1]["weight"], t[1])
    tree = d.tree()
    assert isinstance(tree["model"]["layer"], list)
    assert torch.equal(tree["uni\u00e9"]["k\U0001F600"], t[3])
    sub = d.tree(("model", "layer"))
    assert isinstance(sub, list) and len(sub) == 2
    assert torch.equal(d.tree(("lm_head",)), t[2])
    assert d.tree(("nothing",), default=5) == 5
    with pytest.raises(TypeError):
        d.tree("model")
    with pytest.raises(KeyError):
        d["nothing"]
    # filter_func gets full paths
    seen = []
    d.tree(filter_func=lambda n: seen.append(n) or True)
    assert ("model", "layer", 0, "weight") in seen and "lm_head" in seen


def test_top_level_list(tmp_path):
    p = str(tmp_path / "list.tensors")
    items = [torch.ones(1) * i for i in range(3)]
    write_sd(p, items)
    d = TensorDeserializer(p, device="cpu")
    assert list(d.keys()) == [0, 1, 2]
    assert torch.equal(d[2], items[2])
    tree = d.tree()
    assert isinstance(tree, list) and len(tree) == 3


def test_filter_func_and_gaps(tmp_path):
    p = str(tmp_path / "f.tensors")
    write_sd(p, [torch.ones(1) * i for i in range(6)])
    d = TensorDeserializer(p, device="cpu", filter_func=lambda n: n[0] in (0, 5))
    assert list(d.keys()) == [0, 5]
    tree = d.tree()
    assert len(tree) == 2 and float(tree[1]) == 5.0  # gaps collapse


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.norm = torch.nn.BatchNorm1d(3)
        self.register_buffer("root_buf", torch.arange(3.0))
        self.register_buffer("np_buf", torch.ones(2), persistent=False)
        self.root_param = torch.nn.Parameter(torch.randn(2))


def test_module_roundtrip(tmp_path):
    p = str(tmp_path / "m.tensors")
    torch.manual_seed(0)
    m = Net()
    s = TensorSerializer(p)
    s.write_module(m)
    s.close()
    d = TensorDeserializer(p, device="cpu")
    names = list(d.keys())
    assert names[:2] == [".root_param", ".root_buf"]
    assert "lin.weight" in names and "norm.running_mean" in names
    types_ = {n: t for _, t, n, _ in TensorDeserializer(p, device="cpu", lazy_load=True).read_tensors()}
    assert types_[".root_param"] == TensorType.PARAM
    assert types_[".root_buf"] == TensorType.BUFFER
    module_idx = {n: i for i, _, n, _ in TensorDeserializer(p, device="cpu", lazy_load=True).read_tensors()}
    assert module_idx[".root_buf"] == 0
    assert module_idx["lin.weight"] == 1
    assert module_idx["norm.running_mean"] == 2

    torch.manual_seed(1)
    m2 = Net()
    assert d.load_into_module(m2) == len(names)
    sd2 = m2.state_dict()
    for k, v in m.state_dict().items():
        assert torch.equal(v, sd2[k])
    # Non-persistent buffers come back persistent (upstream behaviour)
    assert "np_buf" in sd2
    ok, results = d.verify_module(m2)
    # Root tensors never match state_dict() names (upstream behaviour)
    failing = {n for n, r in results if not r}
    assert failing == {".root_param", ".root_buf", ".np_buf"}
    assert dict(results)["lin.weight"] is True
    # Corrupt one tensor in the module: verification catches it
    with torch.no_grad():
        m2.lin.weight[0, 0] += 1
    _, results = d.verify_module(m2)
    assert dict(results)["lin.weight"] is False
    d.close()


def test_write_module_options(tmp_path):
    p = str(tmp_path / "m.tensors")
    m = Net()
    s = TensorSerializer(p)
    s.write_module(m, include_non_persistent_buffers=False)
    s.close()
    names = list(TensorDeserializer(p, device="cpu").keys())
    assert ".np_buf" not in names
    assert ".root_buf" in names

    s = TensorSerializer(p)
    s.write_module(m, remove_tensors=True)
    s.close()
    assert m.lin.weight is None and m.root_buf is None


def test_lazy_load_and_read_tensors_continuation(tmp_path):
    p = str(tmp_path / "lazy.tensors")
    sd = {k: torch.ones(2) * i for i, k in enumerate("abcde")}
    write_sd(p, sd)
    d = TensorDeserializer(p, device="cpu", lazy_load=True)
    assert [n for _, _, n, _ in d.read_tensors(num_tensors=2)] == ["a", "b"]
    assert [n for _, _, n, _ in d.read_tensors(num_tensors=2)] == ["c", "d"]
    assert [n for _, _, n, _ in d.read_tensors()] == ["e"]
    assert list(d.read_tensors()) == []
    with pytest.raises(ValueError):
        list(d.read_tensors(num_tensors=-2))

    eager = TensorDeserializer(p, device="cpu")
    assert list(eager.read_tensors()) == []

    # Out-of-order lazy access works
    d = TensorDeserializer(p, device="cpu", lazy_load=True)
    assert float(d["d"][0]) == 3.0
    assert float(d["a"][0]) == 0.0
    assert d["a"] is d["a"]


def test_read_numpy_arrays(tmp_path):
    p = str(tmp_path / "np.tensors")
    write_sd(p, {"f": torch.arange(3.0), "b": torch.ones(2, dtype=torch.bfloat16)})
    d = TensorDeserializer(p, device="cpu", lazy_load=True)
    it = d.read_numpy_arrays()
    idx, typ, name, arr, opaque, tdt = next(it)
    assert name == "f" and not opaque and tdt is None
    assert arr.dtype == numpy.float32 and list(arr) == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="has an opaque datatype"):
        next(it)
    d = TensorDeserializer(p, device="cpu", lazy_load=True)
    out = list(d.read_numpy_arrays(allow_raw_data=True))
    _, _, name, arr, opaque, tdt = out[1]
    assert name == "b" and opaque and tdt == "torch.bfloat16"
    assert arr.dtype == numpy.int16
    assert torch.equal(torch.from_numpy(arr).view(torch.bfloat16), torch.ones(2, dtype=torch.bfloat16))


def test_dtype_casting(tmp_path):
    p = str(tmp_path / "c.tensors")
    write_sd(p, {"f": torch.arange(3.0), "i": torch.arange(3), "b": torch.tensor([True])})
    d = TensorDeserializer(p, device="cpu", dtype=torch.float16)
    assert d["f"].dtype == torch.float16 and d["f"].requires_grad
    assert d["i"].dtype == torch.float16 and not d["i"].requires_grad
    assert d["b"].dtype == torch.bool
    # raw data is still available for numpy
    d = TensorDeserializer(p, device="cpu", dtype=torch.float16, lazy_load=True)
    arrs = {n: a for _, _, n, a, _, _ in d.read_numpy_arrays()}
    assert arrs["f"].dtype == numpy.float32
    with pytest.raises(RuntimeError, match="require gradients"):
        TensorDeserializer(p, device="cpu", dtype=torch.int32)


def test_hash_verification(tmp_path):
    p = tmp_path / "h.tensors"
    write_sd(str(p), {"a": torch.arange(100.0)})
    data = bytearray(p.read_bytes())
    data[-20] ^= 0xFF  # inside the data of "a"
    p.write_bytes(bytes(data))
    TensorDeserializer(str(p), device="cpu")  # no verification: loads
    with pytest.raises(serialization.HashMismatchError, match="failed"):
        TensorDeserializer(str(p), device="cpu", verify_hash=True)
    d = TensorDeserializer(str(p), device="cpu", lazy_load=True)
    with pytest.raises(serialization.HashMismatchError):
        list(d.read_tensors(verify_hash=True))


def test_bad_files(tmp_path):
    p = tmp_path / "bad"
    p.write_bytes(b"not a tensorizer file at all" * 10)
    with pytest.raises(ValueError, match="Not a tensorizer file"):
        TensorDeserializer(str(p), device="cpu")
    p.write_bytes(b"")
    with pytest.raises(ValueError, match="Not a tensorizer file"):
        TensorDeserializer(str(p), device="cpu")
    good = tmp_path / "good"
    write_sd(str(good), {"a": torch.ones(1)})
    data = bytearray(good.read_bytes())
    data[5:9] = struct.pack("<I", 9)
    p.write_bytes(bytes(data))
    with pytest.raises(serialization._FileHeader.InvalidVersionError) as info:
        TensorDeserializer(str(p), device="cpu")
    assert info.value.version == 9
    with pytest.raises(FileNotFoundError):
        TensorDeserializer(str(tmp_path / "missing"), device="cpu")


def test_encrypted_file_without_decryption(tmp_path):
    good = tmp_path / "good"
    write_sd(str(good), {"a": torch.ones(1)})
    data = bytearray(good.read_bytes())
    data[5:9] = struct.pack("<I", 3)  # v3 => crypt_info
    p = tmp_path / "enc"
    p.write_bytes(bytes(data))
    with pytest.raises(CryptographyError, match="decryption was not requested"):
        TensorDeserializer(str(p), device="cpu")


def test_file_objects(tmp_path):
    sd = sample_state_dict()
    # Serializer to a BytesIO (closed by close(), like upstream)
    buf = KeepingBytesIO()
    s = TensorSerializer(buf)
    s.write_state_dict(sd)
    s.write_tensor(0, "extra", TensorType.STATE_DICT, torch.ones(3))
    s.close()
    assert buf.closed
    p = tmp_path / "p.tensors"
    write_sd(str(p), sd)
    s = TensorSerializer(str(tmp_path / "q.tensors"))
    s.write_state_dict(sd)
    s.write_tensor(0, "extra", TensorType.STATE_DICT, torch.ones(3))
    s.close()
    assert buf.final == (tmp_path / "q.tensors").read_bytes()

    # Deserializer from a BytesIO
    src = io.BytesIO(buf.final)
    d = TensorDeserializer(src, device="cpu")
    assert torch.equal(d["extra"], torch.ones(3))
    assert src.closed  # closed after eager loading, as upstream
    with pytest.raises(ValueError, match="Cannot reopen"):
        TensorDeserializer(io.BytesIO(buf.final), device="cpu", num_readers=2)

    # Real file objects
    with open(p, "rb") as f:
        d = TensorDeserializer(f, device="cpu", num_readers=4, lazy_load=True)
        assert torch.equal(d["f32"], sd["f32"])
    with open(tmp_path / "r.tensors", "wb+") as f:
        s = TensorSerializer(f)
        s.write_state_dict(sd)
        s.close()
        assert f.closed
    assert (tmp_path / "r.tensors").read_bytes() == p.read_bytes()

    with open(p, "rb") as f:
        with pytest.raises(ValueError, match="readable, writable"):
            TensorSerializer(f)
    with open(p, "r") as f:
        with pytest.raises(ValueError, match="binary mode"):
            TensorDeserializer(f)


def test_incremental_writes_are_valid(tmp_path):
    buf = KeepingBytesIO()
    s = TensorSerializer(buf)
    for i in range(5):
        s.write_tensor(i, f"t{i}", TensorType.PARAM, torch.full((3,), float(i)))
        # After every write call the stream holds a complete file
        d = TensorDeserializer(io.BytesIO(buf.getvalue()), device="cpu")
        assert list(d.keys()) == [f"t{j}" for j in range(i + 1)]
    assert s.total_tensor_bytes == 5 * 12
    s.close()


def test_write_errors(tmp_path):
    s = TensorSerializer(str(tmp_path / "e.tensors"))
    with pytest.raises(struct.error):
        s.write_tensor(65536, "a", TensorType.PARAM, torch.ones(1))
    with pytest.raises(struct.error):
        s.write_tensor(0, "x" * 65536, TensorType.PARAM, torch.ones(1))
    with pytest.raises(NotImplementedError):
        s.write_tensor(0, "q", TensorType.PARAM, torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8))
    with pytest.raises(ValueError):
        s.write_tensor(0, "", TensorType.PARAM, torch.ones(1))
    with pytest.raises(ValueError):
        s.write_state_dict({"\x1e[1]": torch.ones(1)})
    with pytest.raises(TypeError):
        s.write_state_dict({1: torch.ones(1)})
    with pytest.raises(TypeError):
        s.write_state_dict({"a": 1})
    with pytest.raises(TypeError, match="Cannot serialize an array with dtype"):
        s.write_tensor(0, "u", TensorType.STATE_DICT, numpy.array(["x"]))
    s.write_state_dict({"a": torch.ones(1)})
    with pytest.raises(ValueError, match="Conflicting"):
        s.write_state_dict({"a": torch.ones(1)})
    with pytest.raises(ValueError, match="Conflicting"):
        s.write_state_dict({"a": {"b": torch.ones(1)}})
    s.write_tensor(0, ("m", 0), TensorType.STATE_DICT, torch.ones(1))
    with pytest.raises(ValueError, match="Conflicting"):
        s.write_tensor(0, ("m", "k"), TensorType.STATE_DICT, torch.ones(1))
    s.close()
    with pytest.raises(ValueError):
        s.write_state_dict({"b": torch.ones(1)})
    d = TensorDeserializer(str(tmp_path / "e.tensors"), device="cpu")
    assert list(d.keys()) == ["a", "m"]

    with pytest.raises(TypeError, match="encryption"):
        TensorSerializer(str(tmp_path / "x.tensors"), encryption=object())
    with pytest.raises(TypeError):
        TensorSerializer(str(tmp_path / "x.tensors"), limit_cpu_concurrency="2")
    with pytest.raises(ValueError):
        TensorSerializer(str(tmp_path / "x.tensors"), limit_cpu_concurrency=0)


def test_numpy_and_write_tensor(tmp_path):
    p = str(tmp_path / "n.tensors")
    s = TensorSerializer(p)
    arr = numpy.arange(12, dtype=numpy.int16).reshape(3, 4)[:, ::2]
    s.write_tensor(5, "np", TensorType.BUFFER, arr)
    s.write_tensor(6, ("nested", 0), TensorType.STATE_DICT, torch.ones(2))
    s.close()
    d = TensorDeserializer(p, device="cpu", lazy_load=True)
    out = {n: (i, t, x) for i, t, n, x in d.read_tensors()}
    i, t, x = out["np"]
    assert i == 5 and t == TensorType.BUFFER
    assert x.dtype == torch.int16 and torch.equal(x, torch.from_numpy(numpy.ascontiguousarray(arr)))
    assert out[("nested", 0)][0] == 6


def test_deserializer_argument_checks(tmp_path):
    p = str(tmp_path / "a.tensors")
    write_sd(p, {"a": torch.ones(1), "b": torch.ones(1)})
    with pytest.raises(ValueError):
        TensorDeserializer(p, device="cpu", num_readers=0)
    with pytest.raises(TypeError):
        TensorDeserializer(p, device="cpu", num_readers="2")
    with pytest.raises(TypeError):
        TensorDeserializer(p, device="cpu", encryption=object())
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            TensorDeserializer(p, device="cuda")
        d = TensorDeserializer(p)
        assert d["a"].device.type == "cpu"
    d = TensorDeserializer(p, device="cpu", num_readers=8)
    assert d.total_file_bytes == 8
    assert d.total_tensor_bytes == 8
    assert d.cache_status is None
    d.close()
    d.close()


def test_pathlike_and_uri(tmp_path):
    p = tmp_path / "sub" / "dir" / "a.tensors"
    write_sd(p, {"a": torch.ones(2)})
    d = TensorDeserializer(p, device="cpu")
    assert torch.equal(d["a"], torch.ones(2))
    d = TensorDeserializer(f"file://{p}", device="cpu")
    assert torch.equal(d["a"], torch.ones(2))


def test_meta_device_module_loading(tmp_path):
    from tensorizer.utils import no_init_or_tensor

    p = str(tmp_path / "m.tensors")
    m = Net()
    s = TensorSerializer(p)
    s.write_module(m)
    s.close()
    with no_init_or_tensor():
        empty = Net()
        assert empty.lin.weight.is_meta
        # Loading inside the context still makes real tensors
        d = TensorDeserializer(p, device="cpu")
        d.load_into_module(empty)
    assert torch.equal(empty.lin.weight, m.lin.weight)


def test_bytesio_eager_then_verify(tmp_path):
    # The in-memory copy of a BytesIO source is released after an eager
    # load; headers stay available for verify_module.
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    buf = KeepingBytesIO()
    s = TensorSerializer(buf)
    s.write_module(m)
    s.close()
    d = TensorDeserializer(io.BytesIO(buf.final), device="cpu")
    m2 = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    d.load_into_module(m2)
    ok, results = d.verify_module(m2)
    assert ok, results
    assert torch.equal(m2[1].weight, m[1].weight)
    # dtype conversion keeps the data (raw bytes are re-read on demand)
    d = TensorDeserializer(io.BytesIO(buf.final), device="cpu", dtype=torch.float16)
    arrs = {n: a for _, _, n, a, _, _ in TensorDeserializer(
        io.BytesIO(buf.final), device="cpu", dtype=torch.float16, lazy_load=True
    ).read_numpy_arrays()}
    assert arrs["0.weight"].dtype == numpy.float32
    assert d["0.weight"].dtype == torch.float16


def test_verify_module_needs_loaded_tensors(tmp_path):
    p = str(tmp_path / "v.tensors")
    m = torch.nn.Sequential(torch.nn.Linear(2, 2))
    s = TensorSerializer(p)
    s.write_module(m)
    s.close()
    d = TensorDeserializer(p, device="cpu", lazy_load=True)
    with pytest.raises(RuntimeError, match="No hashes found"):
        d.verify_module(m)
    d.close()
    with pytest.raises(RuntimeError):
        d.verify_module(m)
