"""tensorizer.torch_compat: torch.save / torch.load with storages in a tensorizer sidecar.

Covers the sidecar layout and persistent ids (shared with upstream), storage
sharing (tied weights, views), non-tensor objects, thread / async isolation,
nesting, file_obj forms and callbacks, save/load hooks, TensorSerializer /
TensorDeserializer kwargs (encryption, num_readers, verify_hash), dtypes,
weights_only, map_location, a storage over 4 GiB, and live cross-loading with
upstream tensorizer 2.12.1's torch_compat in both directions.

Tests of behaviour beyond upstream carry ``ours_only`` (the suite also runs
against upstream with TZ_TEST_IMPL=upstream).
"""

from __future__ import annotations

import asyncio
import inspect
import io
import json
import logging
import os
import pickle
import shutil
import threading
import typing
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import tensorizer
from tensorizer import DecryptionParams, EncryptionParams, TensorDeserializer, TensorSerializer
from tensorizer import torch_compat
from tensorizer.torch_compat import tensorizer_loading, tensorizer_saving

ORIGINAL_SAVE = torch.save
ORIGINAL_LOAD = torch.load


# ---------------------------------------------------------------------------
# helpers


class TiedLM(torch.nn.Module):
    """A tiny language model whose output head shares the embedding's weight,
    with non-tensor attributes and a non-persistent buffer."""

    def __init__(self, vocab=50, dim=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("positions", torch.arange(8), persistent=False)
        self.config = {"vocab": vocab, "dim": dim, "name": "tiny", "layers": [1, 2.5, None]}
        self.label = "tied-lm"

    def forward(self, ids):
        return self.head(torch.relu(self.proj(self.norm(self.embed(ids)))))


def _zip_records(path) -> list:
    with zipfile.ZipFile(path) as z:
        return z.namelist()


def _data_records(path) -> list:
    return [n for n in _zip_records(path) if "/data/" in n and not n.endswith("data.pkl")]


def _raw(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _sidecar_entries(path, **kwargs):
    with TensorDeserializer(path, device="cpu", **kwargs) as d:
        return d.tree()


class _PidRecorder(pickle.Unpickler):
    """Reads a data.pkl without torch, recording the persistent ids."""

    def __init__(self, f):
        super().__init__(f)
        self.pids = []

    def persistent_load(self, pid):
        self.pids.append(pid)
        return pid

    def find_class(self, module, name):
        if name in ("_rebuild_tensor_v2", "_rebuild_parameter"):
            return lambda *args: ("rebuilt", args)
        return super().find_class(module, name)


def _persistent_ids(pt_path) -> list:
    with zipfile.ZipFile(pt_path) as z:
        (name,) = [n for n in z.namelist() if n.endswith("/data.pkl")]
        r = _PidRecorder(io.BytesIO(z.read(name)))
        r.load()
        return r.pids


def _assert_plain_torch():
    assert torch.save is ORIGINAL_SAVE
    assert torch.load is ORIGINAL_LOAD


# ---------------------------------------------------------------------------
# basics


def test_importable_as_submodule():
    import tensorizer.torch_compat as tc

    assert tensorizer.torch_compat is tc
    assert "torch_compat" in tensorizer.__all__
    assert set(tc.__all__) == {"tensorizer_saving", "tensorizer_loading"}


def _parameters(fn):
    return [(p.name, p.default) for p in inspect.signature(fn, follow_wrapped=False).parameters.values()]


def test_wrappers_show_torchs_signatures():
    # Code that inspects torch.save / torch.load (as upstream's tests do) sees
    # the same parameters and defaults inside the contexts as outside.
    save, load = _parameters(ORIGINAL_SAVE), _parameters(ORIGINAL_LOAD)
    assert save[:3] == [("obj", inspect.Parameter.empty), ("f", inspect.Parameter.empty), ("pickle_module", pickle)]
    assert load[:3] == [("f", inspect.Parameter.empty), ("map_location", None),
                        ("pickle_module", torch_compat._LOAD_WRAPPER_DEFAULT_MODULE)]
    with tensorizer_saving(), tensorizer_loading():
        assert torch.save is not ORIGINAL_SAVE and torch.load is not ORIGINAL_LOAD
        assert _parameters(torch.save) == save
        assert _parameters(torch.load) == load


def test_patches_only_while_active(tmp_path):
    _assert_plain_torch()
    with tensorizer_saving():
        assert torch.save is not ORIGINAL_SAVE
        assert torch.load is ORIGINAL_LOAD
        with tensorizer_loading():
            assert torch.load is not ORIGINAL_LOAD
        assert torch.load is ORIGINAL_LOAD
    _assert_plain_torch()


def test_tied_embedding_model(tmp_path):
    torch.manual_seed(0)
    model = TiedLM().eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    expected = model(ids)
    path = tmp_path / "model.pt"
    with tensorizer_saving():
        torch.save(model, path)
    assert (tmp_path / "model.pt.tensors").is_file()
    # No tensor data in the .pt itself
    assert _data_records(path) == []
    # One sidecar entry per distinct storage: the tied weight is stored once
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    entries = _sidecar_entries(str(path) + ".tensors")
    assert len(entries) == len(storages)

    with tensorizer_loading(device="cpu"):
        loaded = torch.load(path, weights_only=False)
    assert type(loaded) is TiedLM
    assert loaded.head.weight is loaded.embed.weight
    for (n1, a), (n2, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert n1 == n2 and a.dtype == b.dtype and torch.equal(a, b)
    assert torch.equal(loaded.positions, model.positions)
    assert "positions" in loaded._non_persistent_buffers_set
    assert loaded.config == model.config and loaded.label == "tied-lm"
    assert loaded.embed.weight.requires_grad
    assert torch.equal(loaded.eval()(ids), expected)


def test_views_stay_views(tmp_path):
    numbers = torch.arange(1, 10)
    evens = numbers[1::2]
    path = tmp_path / "views.pt"
    with tensorizer_saving():
        torch.save({"numbers": numbers, "evens": evens}, path)
    assert len(_sidecar_entries(str(path) + ".tensors")) == 1
    with tensorizer_loading(device="cpu"):
        out = torch.load(path)
    n, e = out["numbers"], out["evens"]
    assert torch.equal(n, numbers) and torch.equal(e, torch.tensor([2, 4, 6, 8]))
    assert _same_storage(n, e)
    assert e.storage_offset() == 1 and e.stride() == (2,)
    n[3] = 100  # a write through one is seen through the other
    assert e[1].item() == 100


def test_non_tensor_objects_match_torch(tmp_path):
    obj = {
        "int": 3,
        "str": "text",
        "bytes": b"\x00\x01",
        "none": None,
        "tuple": (1, (2.5, "x")),
        "set": {1, 2},
        "nested": {"list": [torch.ones(2), {"deep": torch.zeros(3, dtype=torch.int16)}]},
        "dtype": torch.bfloat16,
        "device": torch.device("cpu"),
        "size": torch.Size([2, 3]),
    }
    plain = tmp_path / "plain.pt"
    ours = tmp_path / "ours.pt"
    torch.save(obj, plain)
    with tensorizer_saving():
        torch.save(obj, ours)
    with tensorizer_loading(device="cpu"):
        got = torch.load(ours)
    want = torch.load(plain, weights_only=False)
    assert got.keys() == want.keys()
    for k in want:
        if k == "nested":
            continue
        assert got[k] == want[k] and type(got[k]) is type(want[k]), k
    assert torch.equal(got["nested"]["list"][0], torch.ones(2))
    deep = got["nested"]["list"][1]["deep"]
    assert deep.dtype == torch.int16 and torch.equal(deep, torch.zeros(3, dtype=torch.int16))


def test_tensor_kinds_match_plain_torch(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    objects = {
        "bf16": torch.randn(5, 3).to(torch.bfloat16),
        "fp8_e4m3": torch.randn(7).to(torch.float8_e4m3fn),
        "fp8_e5m2": torch.randn(2, 2).to(torch.float8_e5m2),
        "fp16": torch.randn(3).half(),
        "complex": torch.randn(3, dtype=torch.complex64),
        "bool": torch.tensor([True, False, True]),
        "uint8": torch.arange(5, dtype=torch.uint8),
        "int64": torch.arange(-3, 3),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "meta": torch.empty(3, 2, device="meta"),
        "transposed": base.t(),
        "slice": base[1:3, 2:5],
        "param": torch.nn.Parameter(torch.randn(2, 2)),
        "frozen": torch.nn.Parameter(torch.randn(2), requires_grad=False),
        "untyped": torch.arange(4, dtype=torch.int32).untyped_storage(),
        "reinterpreted": base.view(torch.int32),
    }
    ours = tmp_path / "kinds.pt"
    with tensorizer_saving():
        torch.save(objects, ours)
    with tensorizer_loading(device="cpu"):
        got = torch.load(ours)
    for name, want in objects.items():
        g = got[name]
        assert type(g) is type(want) or isinstance(want, torch.UntypedStorage), name
        if isinstance(want, torch.UntypedStorage):
            # torch itself loads an UntypedStorage back as a uint8 TypedStorage
            assert bytes(g._untyped_storage) == bytes(want), name
            continue
        assert g.dtype == want.dtype and g.shape == want.shape, name
        assert g.stride() == want.stride() and g.storage_offset() == want.storage_offset(), name
        assert g.requires_grad == want.requires_grad, name
        if want.is_meta:
            assert g.is_meta, name
        else:
            assert _raw(g) == _raw(want), name
    # different dtypes over one storage stay one storage
    assert _same_storage(got["transposed"], got["reinterpreted"])
    assert _same_storage(got["slice"], got["transposed"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2])
def test_low_precision_model(tmp_path, dtype):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2)).to(dtype)
    path = tmp_path / "lp.pt"
    with tensorizer_saving():
        torch.save(model, path)
    with tensorizer_loading(device="cpu"):
        loaded = torch.load(path, weights_only=False)
    for a, b in zip(model.parameters(), loaded.parameters()):
        assert b.dtype == dtype
        assert _raw(a) == _raw(b)


def test_persistent_ids_and_sidecar_layout(tmp_path):
    numbers = torch.arange(1, 10)
    half = torch.randn(4).half()
    untyped = torch.arange(3, dtype=torch.int16).untyped_storage()
    path = tmp_path / "ids.pt"
    with tensorizer_saving():
        torch.save([numbers, numbers[1::2], half, untyped, torch.empty(0)], path)
    pids = _persistent_ids(path)
    ours = [p for p in pids if p[0] == "TensorizerPickler"]
    assert ours == [
        ("TensorizerPickler", 0, "storage", 0, torch.int64),
        ("TensorizerPickler", 0, "storage", 0, torch.int64),
        ("TensorizerPickler", 0, "storage", 1, torch.float16),
        ("TensorizerPickler", 0, "storage", 2, None),
    ]
    # the empty tensor has no data: torch's own record
    assert [p[0] for p in pids if p[0] != "TensorizerPickler"] == ["storage"]

    with TensorDeserializer(str(path) + ".tensors", device="cpu", lazy_load=True) as d:
        meta = d._metadata
    assert [e.name for e in meta.values()] == [(0,), (1,), (2,)]
    for e, n in zip(meta.values(), (72, 8, 6)):
        assert e.type == tensorizer.TensorType.STATE_DICT
        assert e.dtype == "|u1" and tuple(e.shape) == (n,)
    entries = _sidecar_entries(str(path) + ".tensors")
    assert bytes(entries[0].numpy()) == numbers.numpy().tobytes()
    assert bytes(entries[2].numpy()) == bytes(untyped)


def test_no_tensors_no_sidecar(tmp_path):
    path = tmp_path / "plain.pt"
    with tensorizer_saving():
        torch.save({"a": 1, "empty": torch.empty(0)}, path)
    assert not (tmp_path / "plain.pt.tensors").exists()
    with tensorizer_loading():
        assert torch.load(path)["a"] == 1


def test_plain_checkpoint_loads_inside_context(tmp_path):
    path = tmp_path / "plain.pt"
    torch.save({"w": torch.arange(4.0)}, path)
    with tensorizer_loading(file_obj=tmp_path / "missing.tensors"):
        out = torch.load(path)
    assert torch.equal(out["w"], torch.arange(4.0))


def test_sidecar_needed_outside_context(tmp_path):
    path = tmp_path / "x.pt"
    with tensorizer_saving():
        torch.save({"w": torch.arange(4.0)}, path)
    with pytest.raises(Exception):
        torch.load(path, weights_only=False)


def test_legacy_format(tmp_path):
    path = tmp_path / "legacy.pt"
    n = torch.arange(6)
    obj = {"n": n, "v": n[::2]}
    with tensorizer_saving():
        torch.save(obj, path, _use_new_zipfile_serialization=False)
    assert (tmp_path / "legacy.pt.tensors").is_file()
    with tensorizer_loading(device="cpu"):
        out = torch.load(path)
    assert torch.equal(out["v"], obj["v"]) and _same_storage(out["n"], out["v"])


# ---------------------------------------------------------------------------
# threads, tasks, nesting


def test_other_threads_see_plain_torch(tmp_path):
    barrier = threading.Barrier(2)
    errors = []

    def other():
        try:
            barrier.wait(10)  # both threads are now saving inside our window
            torch.save({"x": torch.arange(5)}, tmp_path / "other.pt")
            barrier.wait(10)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=other)
    with tensorizer_saving():
        t.start()
        barrier.wait(10)
        torch.save({"x": torch.arange(5)}, tmp_path / "mine.pt")
        barrier.wait(10)
        t.join(10)
    assert not errors
    assert (tmp_path / "mine.pt.tensors").is_file()
    assert not (tmp_path / "other.pt.tensors").exists()
    assert _data_records(tmp_path / "other.pt")
    assert torch.equal(torch.load(tmp_path / "other.pt")["x"], torch.arange(5))
    _assert_plain_torch()


def test_threads_with_their_own_contexts(tmp_path):
    def work(i):
        obj = {"x": torch.full((100,), i)}
        with tensorizer_saving(tmp_path / f"side{i}.tensors"):
            torch.save(obj, tmp_path / f"{i}.pt")
        with tensorizer_loading(tmp_path / f"side{i}.tensors", device="cpu"):
            return torch.load(tmp_path / f"{i}.pt")["x"]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(work, range(8)))
    for i, x in enumerate(results):
        assert torch.equal(x, torch.full((100,), i))
    _assert_plain_torch()


def test_async_tasks_are_isolated(tmp_path):
    async def saver(name, use_ctx, started, proceed):
        if use_ctx:
            with tensorizer_saving():
                started.set()
                await proceed.wait()
                torch.save({"x": torch.ones(3)}, tmp_path / name)
        else:
            started.set()
            await proceed.wait()
            torch.save({"x": torch.ones(3)}, tmp_path / name)

    async def main():
        events = [(asyncio.Event(), asyncio.Event()) for _ in range(2)]
        tasks = [
            asyncio.create_task(saver("ctx.pt", True, *events[0])),
            asyncio.create_task(saver("plain.pt", False, *events[1])),
        ]
        for started, _ in events:
            await started.wait()
        # both tasks are suspended, one inside its context: let the plain one go first
        events[1][1].set()
        await tasks[1]
        events[0][1].set()
        await tasks[0]

    asyncio.run(main())
    assert (tmp_path / "ctx.pt.tensors").is_file()
    assert not (tmp_path / "plain.pt.tensors").exists()
    _assert_plain_torch()


def test_nested_contexts_restore_outer(tmp_path):
    seen = []

    def outer_cb(f):
        seen.append(("outer", Path(f).name))
        return str(f) + ".outer"

    with tensorizer_saving(outer_cb):
        torch.save(torch.arange(3), tmp_path / "a.pt")
        with tensorizer_saving(tmp_path / "inner.tensors"):
            torch.save(torch.arange(4), tmp_path / "b.pt")
            with tensorizer_saving(lambda f: None):
                torch.save(torch.arange(5), tmp_path / "c.pt")
            torch.save(torch.arange(6), tmp_path / "d.pt")
        torch.save(torch.arange(7), tmp_path / "e.pt")
    _assert_plain_torch()
    assert seen == [("outer", "a.pt"), ("outer", "e.pt")]
    assert (tmp_path / "a.pt.outer").is_file() and (tmp_path / "e.pt.outer").is_file()
    assert (tmp_path / "inner.tensors").is_file()  # d.pt's, written over b.pt's
    assert not list(tmp_path.glob("c.pt.*"))  # c.pt is plain torch
    assert _data_records(tmp_path / "c.pt")

    with tensorizer_loading(lambda f: str(f) + ".outer", device="cpu"):
        assert torch.equal(torch.load(tmp_path / "a.pt"), torch.arange(3))
        with tensorizer_loading(tmp_path / "inner.tensors", device="cpu"):
            assert torch.equal(torch.load(tmp_path / "d.pt"), torch.arange(6))
            assert torch.equal(torch.load(tmp_path / "c.pt"), torch.arange(5))
        assert torch.equal(torch.load(tmp_path / "e.pt"), torch.arange(7))
    _assert_plain_torch()


def test_saving_and_loading_at_once(tmp_path):
    model = TiedLM()
    with tensorizer_saving(), tensorizer_loading(device="cpu"):
        torch.save(model, tmp_path / "m.pt")
        loaded = torch.load(tmp_path / "m.pt", weights_only=False)
        torch.save(loaded, tmp_path / "m2.pt")
        again = torch.load(tmp_path / "m2.pt", weights_only=False)
    assert again.head.weight is again.embed.weight
    assert torch.equal(again.embed.weight, model.embed.weight)
    _assert_plain_torch()


def test_context_exits_on_error(tmp_path):
    with pytest.raises(KeyError):
        with tensorizer_saving(), tensorizer_loading():
            raise KeyError("boom")
    _assert_plain_torch()


# ---------------------------------------------------------------------------
# file_obj forms


@pytest.mark.parametrize(
    "form",
    ["str", "pathlike", pytest.param("bytes", marks=pytest.mark.ours_only)],  # upstream: TypeError
)
def test_file_obj_path_forms(tmp_path, form):
    t = torch.arange(10)
    target = {"str": str, "pathlike": Path, "bytes": os.fsencode}[form](tmp_path / "side.tensors")
    with tensorizer_saving(target):
        torch.save(t, tmp_path / "x.pt")
    assert (tmp_path / "side.tensors").is_file()
    with tensorizer_loading(target, device="cpu"):
        assert torch.equal(torch.load(tmp_path / "x.pt"), t)


def test_file_obj_open_files(tmp_path):
    t = torch.arange(10.0)
    side = tmp_path / "side.tensors"
    with open(side, "wb+") as sf:
        with tensorizer_saving(sf):
            torch.save(t, tmp_path / "x.pt")
    with open(side, "rb") as sf:
        with tensorizer_loading(sf, device="cpu"):
            assert torch.equal(torch.load(tmp_path / "x.pt"), t)


def test_torch_target_is_open_file(tmp_path):
    t = torch.arange(10.0)
    with open(tmp_path / "f.pt", "wb") as f:
        with tensorizer_saving():
            torch.save(t, f)
    assert (tmp_path / "f.pt.tensors").is_file()
    with open(tmp_path / "f.pt", "rb") as f:
        with tensorizer_loading(device="cpu"):
            assert torch.equal(torch.load(f), t)


def test_bytesio_target_falls_back_to_plain_torch(caplog):
    buf = io.BytesIO()
    with caplog.at_level(logging.WARNING, logger="tensorizer.torch_compat"):
        with tensorizer_saving():
            torch.save({"x": torch.arange(3)}, buf)
    assert any("BytesIO" in r.getMessage() for r in caplog.records)
    buf.seek(0)
    assert torch.equal(torch.load(buf)["x"], torch.arange(3))  # plain torch, outside


def test_bytesio_target_with_file_obj(tmp_path):
    buf = io.BytesIO()
    side = tmp_path / "buf.tensors"
    with tensorizer_saving(side):
        torch.save({"x": torch.arange(3)}, buf)
    assert side.is_file()
    buf.seek(0)
    with tensorizer_loading(side, device="cpu"):
        assert torch.equal(torch.load(buf)["x"], torch.arange(3))


def test_callback_receives_target_and_none_means_plain(tmp_path):
    calls = []

    def choose(f):
        calls.append(f)
        return None if Path(f).stem == "skip" else tmp_path / (Path(f).stem + ".side")

    with tensorizer_saving(choose):
        torch.save(torch.arange(3), tmp_path / "keep.pt")
        torch.save(torch.arange(4), tmp_path / "skip.pt")
    assert [Path(c).name for c in calls] == ["keep.pt", "skip.pt"]
    assert (tmp_path / "keep.side").is_file() and not (tmp_path / "skip.side").exists()
    assert _data_records(tmp_path / "skip.pt") and not _data_records(tmp_path / "keep.pt")
    assert torch.equal(torch.load(tmp_path / "skip.pt"), torch.arange(4))
    with tensorizer_loading(choose, device="cpu"):
        assert torch.equal(torch.load(tmp_path / "keep.pt"), torch.arange(3))
        assert torch.equal(torch.load(tmp_path / "skip.pt"), torch.arange(4))


@pytest.mark.ours_only
def test_sidecar_reference_without_location_is_explained(tmp_path):
    with tensorizer_saving():
        torch.save(torch.arange(3), tmp_path / "x.pt")
    with tensorizer_loading(lambda f: None):
        with pytest.raises(pickle.UnpicklingError, match="sidecar"):
            torch.load(tmp_path / "x.pt")


@pytest.mark.ours_only
def test_nameless_file_object_falls_back(caplog):
    class Sink(io.RawIOBase):
        def __init__(self):
            self.data = bytearray()

        def writable(self):
            return True

        def write(self, b):
            self.data += b
            return len(b)

    sink = Sink()
    with caplog.at_level(logging.WARNING, logger="tensorizer.torch_compat"):
        with tensorizer_saving():
            torch.save(torch.arange(3), sink)
    assert any("Sink" in r.getMessage() for r in caplog.records)
    assert torch.equal(torch.load(io.BytesIO(bytes(sink.data))), torch.arange(3))


def test_custom_pickle_module_refused(tmp_path):
    import types

    fake = types.ModuleType("fake_pickle")
    fake.__dict__.update(pickle.__dict__)
    with tensorizer_saving():
        with pytest.raises(ValueError):
            torch.save(torch.arange(3), tmp_path / "x.pt", pickle_module=fake)
        torch.save(torch.arange(3), tmp_path / "x.pt", pickle_module=pickle)
    with tensorizer_loading(device="cpu"):
        with pytest.raises(ValueError):
            torch.load(tmp_path / "x.pt", pickle_module=fake)
        assert torch.equal(torch.load(tmp_path / "x.pt", pickle_module=pickle), torch.arange(3))


# ---------------------------------------------------------------------------
# hooks and kwargs


def test_async_save_func_and_load_func(tmp_path):
    pool = ThreadPoolExecutor(1)
    futures = []
    saved = {}

    def save_func(target, tensors, kwargs):
        saved.update(target=target, kwargs=dict(kwargs), n=len(tensors))
        assert all(t.dtype == torch.uint8 and t.dim() == 1 for t in tensors)

        def write():
            s = TensorSerializer(target, **kwargs)
            s.write_state_dict(tensors)
            s.close()

        futures.append(pool.submit(write))

    loaded_with = {}

    def load_func(target, kwargs):
        loaded_with.update(target=target, kwargs=dict(kwargs))
        with TensorDeserializer(target, **kwargs) as d:
            return list(d.tree())

    model = TiedLM()
    with tensorizer_saving(save_func=save_func, limit_cpu_concurrency=1):
        torch.save(model, tmp_path / "m.pt")
    for f in futures:
        f.result(timeout=60)
    pool.shutdown()
    assert saved["target"] == str(tmp_path / "m.pt") + ".tensors"
    assert saved["kwargs"] == {"limit_cpu_concurrency": 1}
    assert saved["n"] == 6  # embed(=head), norm w+b, proj w+b, positions

    with tensorizer_loading(load_func=load_func, device="cpu", num_readers=2):
        loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    assert loaded_with["target"] == str(tmp_path / "m.pt") + ".tensors"
    assert loaded_with["kwargs"] == {"device": "cpu", "num_readers": 2}
    assert loaded.head.weight is loaded.embed.weight
    assert torch.equal(loaded.proj.weight, model.proj.weight)


def test_deserializer_kwargs(tmp_path):
    model = TiedLM()
    with tensorizer_saving():
        torch.save(model, tmp_path / "m.pt")
    with tensorizer_loading(device="cpu", num_readers=3, verify_hash=True, lazy_load=True):
        loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    assert torch.equal(loaded.proj.bias, model.proj.bias)
    # a corrupted sidecar fails hash verification
    side = tmp_path / "m.pt.tensors"
    raw = bytearray(side.read_bytes())
    raw[-20] ^= 0xFF  # inside the last storage's data (before the 8-byte end marker)
    side.write_bytes(bytes(raw))
    with tensorizer_loading(device="cpu", verify_hash=True):
        with pytest.raises(tensorizer.serialization.HashMismatchError):
            torch.load(tmp_path / "m.pt", weights_only=False)


def test_encryption_kwargs(tmp_path):
    model = TiedLM()
    enc = EncryptionParams.random()
    with tensorizer_saving(encryption=enc):
        torch.save(model, tmp_path / "m.pt")
    with tensorizer_loading(device="cpu"):
        with pytest.raises(Exception):
            torch.load(tmp_path / "m.pt", weights_only=False)
    with tensorizer_loading(device="cpu", encryption=DecryptionParams.from_key(enc.key)):
        loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    assert torch.equal(loaded.embed.weight, model.embed.weight)
    assert loaded.head.weight is loaded.embed.weight


def test_encryption_with_password(tmp_path):
    t = {"w": torch.randn(64)}
    enc = EncryptionParams.from_string("correct horse", opslimit=1, memlimit=8 << 20)
    with tensorizer_saving(encryption=enc):
        torch.save(t, tmp_path / "p.pt")
    with tensorizer_loading(device="cpu", encryption=DecryptionParams.from_string("correct horse")):
        assert torch.equal(torch.load(tmp_path / "p.pt")["w"], t["w"])
    with tensorizer_loading(device="cpu", encryption=DecryptionParams.from_string("wrong")):
        with pytest.raises(tensorizer.CryptographyError):
            torch.load(tmp_path / "p.pt")


@pytest.mark.ours_only
def test_storage_corrupting_kwargs_refused():
    with pytest.raises(ValueError, match="dtype"):
        with tensorizer_loading(dtype=torch.float16):
            pass
    with pytest.raises(ValueError, match="filter_func"):
        with tensorizer_loading(filter_func=lambda name: True):
            pass
    _assert_plain_torch()


# ---------------------------------------------------------------------------
# weights_only


def test_weights_only_unset_loads(tmp_path):
    with tensorizer_saving():
        torch.save({"w": torch.arange(3)}, tmp_path / "w.pt")
    with tensorizer_loading(device="cpu"):
        assert torch.equal(torch.load(tmp_path / "w.pt")["w"], torch.arange(3))
        assert torch.equal(torch.load(tmp_path / "w.pt", weights_only=False)["w"], torch.arange(3))


@pytest.mark.ours_only
def test_weights_only_true_refused_with_explanation(tmp_path):
    with tensorizer_saving():
        torch.save({"w": torch.arange(3)}, tmp_path / "w.pt")
    with tensorizer_loading(device="cpu"):
        with pytest.raises(RuntimeError, match="suppress_weights_only"):
            torch.load(tmp_path / "w.pt", weights_only=True)


def test_weights_only_true_without_suppression_fails(tmp_path):
    with tensorizer_saving():
        torch.save({"w": torch.arange(3)}, tmp_path / "w.pt")
    with tensorizer_loading(device="cpu"):
        # torch's own message for this case, which upstream passes on
        with pytest.raises(RuntimeError, match="Can not safely load weights when explicit pickle_module"):
            torch.load(tmp_path / "w.pt", weights_only=True)


def test_the_file_like_alias_names_what_callbacks_receive():
    # Upstream's name; user callbacks use it in annotations evaluated at def time.
    from tensorizer import torch_compat

    assert str in typing.get_args(torch_compat._FileLike)


def test_suppress_weights_only(tmp_path):
    with tensorizer_saving():
        torch.save({"w": torch.arange(3)}, tmp_path / "w.pt")
    with tensorizer_loading(device="cpu", suppress_weights_only=True):
        assert torch.equal(torch.load(tmp_path / "w.pt", weights_only=True)["w"], torch.arange(3))


# ---------------------------------------------------------------------------
# map_location (beyond upstream)


def _views_checkpoint(tmp_path):
    numbers = torch.arange(1, 10)
    with tensorizer_saving():
        torch.save({"numbers": numbers, "evens": numbers[1::2], "w": torch.randn(3, 4)}, tmp_path / "v.pt")
    return tmp_path / "v.pt"


@pytest.mark.ours_only
@pytest.mark.parametrize("where", ["cpu", torch.device("cpu"), {"cpu": "cpu"}, {"cuda:0": "cpu"}])
def test_map_location_to_cpu(tmp_path, where):
    path = _views_checkpoint(tmp_path)
    # device="cuda" would fail on a machine without CUDA: map_location decides
    default = "cuda" if isinstance(where, dict) and "cuda:0" in where else "cpu"
    if default == "cuda" and torch.cuda.is_available():
        pytest.skip("checks the remapping of an unavailable device")
    with tensorizer_loading(device=default):
        out = torch.load(path, map_location=where)
    assert out["numbers"].device.type == "cpu"
    assert torch.equal(out["evens"], torch.tensor([2, 4, 6, 8]))
    assert _same_storage(out["numbers"], out["evens"])


@pytest.mark.ours_only
def test_map_location_overrides_device(tmp_path):
    path = _views_checkpoint(tmp_path)
    with tensorizer_loading(device="meta"):
        out = torch.load(path, map_location="cpu")
    assert out["w"].device.type == "cpu"


@pytest.mark.ours_only
def test_map_location_callable(tmp_path):
    path = _views_checkpoint(tmp_path)
    calls = []

    def mapper(storage, location):
        calls.append((location, storage.device.type, storage.nbytes()))
        return None if location == "cpu" and len(calls) == 1 else storage

    with tensorizer_loading(device="cpu"):
        out = torch.load(path, map_location=mapper)
    assert sorted(calls) == [("cpu", "cpu", 48), ("cpu", "cpu", 72)]
    assert _same_storage(out["numbers"], out["evens"])
    assert torch.equal(out["evens"], torch.tensor([2, 4, 6, 8]))


@pytest.mark.ours_only
@pytest.mark.parametrize("how", ["map_location", "device"])
def test_meta_reads_no_data(tmp_path, how):
    path = tmp_path / "v.pt"
    # Encrypted with a key the load does not have: a meta load must not read data
    data = {"numbers": torch.arange(1, 10), "w": torch.randn(3, 4)}
    data["evens"] = data["numbers"][1::2]
    with tensorizer_saving(encryption=EncryptionParams.random()):
        torch.save(data, path)
    wrong_key = DecryptionParams.from_key(bytes(32))
    if how == "device":
        with tensorizer_loading(device="meta", encryption=wrong_key):
            out = torch.load(path)
    else:
        with tensorizer_loading(device="cpu", encryption=wrong_key):
            out = torch.load(path, map_location="meta")
    assert out["w"].is_meta and out["w"].shape == (3, 4) and out["w"].dtype == torch.float32
    assert out["evens"].is_meta and out["evens"].shape == (4,) and out["evens"].stride() == (2,)
    assert out["evens"].storage_offset() == 1
    assert out["numbers"].untyped_storage().nbytes() == 72


@pytest.mark.ours_only
def test_map_location_bad_type(tmp_path):
    path = _views_checkpoint(tmp_path)
    with tensorizer_loading(device="cpu"):
        with pytest.raises((TypeError, AttributeError, RuntimeError)):
            torch.load(path, map_location=42)


# ---------------------------------------------------------------------------
# a storage over 4 GiB (data version 5)


def _large_test_possible(nbytes):
    try:
        import psutil
    except ImportError:
        return False
    free_disk = shutil.disk_usage(os.environ.get("TMPDIR", "/tmp")).free
    return psutil.virtual_memory().available > 3 * nbytes and free_disk > 2 * nbytes


LARGE = (4 << 30) + 8193  # past 4 GiB by two pages and a byte


@pytest.mark.skipif(
    os.environ.get("TZ_SKIP_LARGE_TESTS", "") not in ("", "0"),
    reason="TZ_SKIP_LARGE_TESTS is set",
)
def test_storage_over_4gib(tmp_path):
    """A real storage of 4 GiB + 8193 bytes (about 25 s here; needs ~13 GiB of memory).

    Set TZ_SKIP_LARGE_TESTS=1 to skip it."""
    if not _large_test_possible(LARGE):
        pytest.skip("not enough memory or disk for a 4 GiB storage")
    # Untouched pages of a fresh allocation read as zeros without using memory;
    # only the marked ones are backed.
    big = torch.empty(LARGE, dtype=torch.uint8)
    marks = {0: 1, 4096 * 3: 2, (1 << 32) - 1: 3, 1 << 32: 4, LARGE - 1: 5}
    for i, v in marks.items():
        big[i] = v
    small = torch.arange(5, dtype=torch.int16)
    obj = {"big": big, "tail": big[(1 << 32) - 2 :], "small": small}
    path = tmp_path / "big.pt"
    with tensorizer_saving():
        torch.save(obj, path)
    with open(str(path) + ".tensors", "rb") as f:
        header = f.read(9)
    assert header[:5] == b"|TZR|" and int.from_bytes(header[5:9], "little") == 5
    del obj
    with tensorizer_loading(device="cpu"):
        out = torch.load(path)
    got = out["big"]
    assert got.numel() == LARGE and _same_storage(got, out["tail"])
    for i, v in marks.items():
        assert got[i].item() == v
    assert out["tail"][1].item() == 3 and out["tail"][2].item() == 4
    assert torch.equal(out["small"], small)
    assert torch.equal(got, big)


# ---------------------------------------------------------------------------
# cross-loading with upstream's torch_compat

_BUILD = r"""
import torch

def build():
    g = torch.Generator().manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Embedding(40, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 40, bias=False)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    model[2].weight = model[0].weight
    numbers = torch.arange(1, 10)
    return {
        "model": model,
        "numbers": numbers,
        "evens": numbers[1::2],
        "bf16": torch.randn(6, generator=g).to(torch.bfloat16),
        "fp8": torch.randn(5, generator=g).to(torch.float8_e4m3fn),
        "untyped": torch.arange(4, dtype=torch.int16).untyped_storage(),
        "meta": {"epoch": 3, "names": ["a", "b"]},
    }

def check(out):
    want = build()
    res = {}
    res["tied"] = out["model"][2].weight is out["model"][0].weight
    res["model_equal"] = all(
        torch.equal(a, b) for a, b in zip(want["model"].state_dict().values(), out["model"].state_dict().values())
    )
    res["evens"] = out["evens"].tolist()
    res["shared"] = out["evens"].untyped_storage().data_ptr() == out["numbers"].untyped_storage().data_ptr()
    out["numbers"][3] = 100
    res["write_through"] = out["evens"][1].item()
    res["bf16"] = out["bf16"].dtype == torch.bfloat16 and torch.equal(out["bf16"], want["bf16"])
    res["fp8"] = out["fp8"].dtype == torch.float8_e4m3fn and torch.equal(
        out["fp8"].view(torch.uint8), want["fp8"].view(torch.uint8))
    res["untyped"] = bytes(out["untyped"]._untyped_storage) == bytes(want["untyped"])
    res["meta"] = out["meta"]
    return res
"""

_UPSTREAM_CODE = _BUILD + r"""
import hashlib, json, sys, zipfile
from pathlib import Path
from tensorizer import DecryptionParams, EncryptionParams
from tensorizer.torch_compat import tensorizer_loading, tensorizer_saving

root = Path(sys.argv[1])
key = bytes.fromhex(sys.argv[2])
report = {}
with tensorizer_loading(device="cpu"):
    report["ours_plain"] = check(torch.load(root / "ours" / "plain.pt", weights_only=False))
with tensorizer_loading(device="cpu", encryption=DecryptionParams.from_key(key)):
    report["ours_encrypted"] = check(torch.load(root / "ours" / "enc.pt", weights_only=False))
(root / "up").mkdir()
with tensorizer_saving():
    torch.save(build(), root / "up" / "plain.pt")
with tensorizer_saving(encryption=EncryptionParams(key)):
    torch.save(build(), root / "up" / "enc.pt")
print(json.dumps(report))
"""


def _build_ns():
    ns = {}
    exec(compile(_BUILD, "<compat build>", "exec"), ns)
    return ns


@pytest.fixture(scope="module")
def cross(tmp_path_factory, upstream):
    root = tmp_path_factory.mktemp("compat_cross")
    (root / "ours").mkdir()
    ns = _build_ns()
    key = bytes(range(32))
    with tensorizer_saving():
        torch.save(ns["build"](), root / "ours" / "plain.pt")
    with tensorizer_saving(encryption=EncryptionParams(key)):
        torch.save(ns["build"](), root / "ours" / "enc.pt")
    report = upstream.run_upstream_json(_UPSTREAM_CODE, args=[root, key.hex()])
    return root, ns, key, report


_EXPECTED_CHECK = {
    "tied": True,
    "model_equal": True,
    "evens": [2, 4, 6, 8],
    "shared": True,
    "write_through": 100,
    "bf16": True,
    "fp8": True,
    "untyped": True,
    "meta": {"epoch": 3, "names": ["a", "b"]},
}


@pytest.mark.parametrize("case", ["ours_plain", "ours_encrypted"])
def test_upstream_loads_ours(cross, case):
    _, _, _, report = cross
    assert report[case] == _EXPECTED_CHECK


@pytest.mark.parametrize("case", ["plain", "enc"])
def test_ours_loads_upstream(cross, case):
    root, ns, key, _ = cross
    kwargs = {"encryption": DecryptionParams.from_key(key)} if case == "enc" else {}
    with tensorizer_loading(device="cpu", **kwargs):
        out = torch.load(root / "up" / f"{case}.pt", weights_only=False)
    assert json.loads(json.dumps(ns["check"](out))) == _EXPECTED_CHECK


def test_files_identical_to_upstream(cross):
    root, _, _, _ = cross

    def pickle_bytes(p):
        with zipfile.ZipFile(p) as z:
            (name,) = [n for n in z.namelist() if n.endswith("/data.pkl")]
            return z.read(name)

    assert pickle_bytes(root / "ours" / "plain.pt") == pickle_bytes(root / "up" / "plain.pt")
    ours_side = (root / "ours" / "plain.pt.tensors").read_bytes()
    up_side = (root / "up" / "plain.pt.tensors").read_bytes()
    assert ours_side == up_side


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.ours_only
def test_cuda_storages(tmp_path):
    numbers = torch.arange(1, 10, device="cuda")
    with tensorizer_saving():
        torch.save({"numbers": numbers, "evens": numbers[1::2]}, tmp_path / "c.pt")
    with tensorizer_loading(device="cuda"):
        on_gpu = torch.load(tmp_path / "c.pt")
        on_cpu = torch.load(tmp_path / "c.pt", map_location={"cuda:0": "cpu"})
    assert on_gpu["evens"].is_cuda and _same_storage(on_gpu["numbers"], on_gpu["evens"])
    assert on_cpu["evens"].device.type == "cpu" and on_cpu["evens"].tolist() == [2, 4, 6, 8]
    assert _same_storage(on_cpu["numbers"], on_cpu["evens"])
