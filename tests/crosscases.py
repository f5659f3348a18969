"""Deterministic write cases shared by the test process and the upstream subprocess.

Both processes import this module (the upstream one through PYTHONPATH), build
the very same inputs from fixed seeds, and hand them to *their* ``tensorizer``
(passed in as ``tz``).  So a case's files can be compared byte for byte, and
each side's reader can be pointed at the other side's files.

A case is a function ``(tz) -> list of ops``:

* ``("state_dict", obj)``                      -> ``S.write_state_dict(obj)``
* ``("module", module, kwargs)``               -> ``S.write_module(module, **kwargs)``
* ``("tensor", idx, name, type_int, tensor)``  -> ``S.write_tensor(...)``
* ``("snapshot",)``                            -> copy the file as it is now
  (to ``<path>.snapN``); the serializer is still open

``S.close()`` follows the last op.  ``expected(case)`` computes what a reader
must return (names, module index, type, dtype, shape, sha256 of the raw bytes)
from the inputs alone, following the writer rules of FORMAT.md §4.2/§4.3.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import traceback
from typing import Any, Callable, Dict, List

import numpy
import torch

PARAM, BUFFER, STATE_DICT = 0, 1, 2


# --------------------------------------------------------------------------
# helpers


def gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=gen(seed), dtype=torch.float32).to(dtype)


def raw_bytes(t) -> bytes:
    if isinstance(t, numpy.ndarray):
        return numpy.ascontiguousarray(t).tobytes()
    t = t.detach()
    if t.is_meta:
        return bytes(t.numel() * t.element_size())
    return t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def sha(t) -> str:
    return hashlib.sha256(raw_bytes(t)).hexdigest()


def dtype_name(t) -> str:
    if isinstance(t, numpy.ndarray):
        return str(torch.from_numpy(numpy.ascontiguousarray(t)).dtype).replace("torch.", "")
    return str(t.dtype).replace("torch.", "")


def json_name(name):
    """Normalized name (str or tuple) -> JSON-able (str or list)."""
    return name if isinstance(name, str) else list(name)


def dtypes_available(names) -> List[torch.dtype]:
    """torch dtypes from ``names`` that this torch build has and can hold data in."""
    out = []
    for n in names:
        dt = getattr(torch, n, None)
        if not isinstance(dt, torch.dtype):
            continue
        try:
            t = opaque_tensor(dt, 4)
            t.contiguous().reshape(-1).view(torch.uint8)
        except Exception:
            continue
        out.append(dt)
    return out


_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def opaque_tensor(dt: torch.dtype, n: int, seed: int = 0) -> torch.Tensor:
    """n elements of dtype ``dt`` with pseudo-random bit patterns."""
    width = torch.empty(0, dtype=dt).element_size()
    raw = torch.randint(0, 256, (n * width,), generator=gen(seed), dtype=torch.uint8)
    return raw.view(_INT_OF_WIDTH[width]).view(dt)


# --------------------------------------------------------------------------
# modules (defined here so that both processes build identical ones)


class Sub(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.b = torch.nn.Parameter(randn(2, seed=11))
        self.lin = torch.nn.Linear(3, 2)
        self.register_buffer("count", torch.tensor([5, 6, 7], dtype=torch.int64))


class Nested(torch.nn.Module):
    """Root param + root buffer, a nested submodule and a Sequential."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1234)
        self.w = torch.nn.Parameter(randn(3, 3, seed=10))
        self.register_buffer("buf", torch.arange(4, dtype=torch.float32))
        self.sub = Sub()
        self.seq = torch.nn.Sequential(
            torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)
        )


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(99)
        self.emb = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight


class NonPersistent(torch.nn.Module):
    """Non-persistent buffers at the root and in a submodule.

    The root has no *persistent* buffer: upstream's
    ``include_non_persistent_buffers=False`` compares "kept" with ".kept" and
    so also drops persistent root buffers (see test_api for that quirk).
    """

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.lin = torch.nn.Linear(2, 2)
        self.register_buffer("dropped", torch.full((2,), 4.0), persistent=False)
        self.inner = torch.nn.Module()
        self.inner.register_buffer("tmp", torch.zeros(2, dtype=torch.int32), persistent=False)
        self.inner.register_buffer("stat", torch.arange(3, dtype=torch.int16))
        self.inner.register_buffer("kept", torch.ones(3))


def meta_module(tz):
    def build():
        return torch.nn.Sequential(
            torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.Embedding(5, 2)
        )

    return tz.utils.no_init_or_tensor(build)


# --------------------------------------------------------------------------
# the cases

NATIVE = [
    torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
]
FLOAT8 = ["float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu"]
BITS = ["bits8", "bits16", "bits1x8", "bits2x4", "bits4x2"]
SUBBYTE = [f"uint{i}" for i in range(1, 8)] + [f"int{i}" for i in range(1, 8)] + ["float4_e2m1fn_x2"]


def native_tensor(dt: torch.dtype, seed: int) -> torch.Tensor:
    if dt == torch.bool:
        return torch.randint(0, 2, (33,), generator=gen(seed)).bool()
    if dt.is_complex:
        return torch.randn(5, generator=gen(seed), dtype=dt)
    if dt.is_floating_point:
        return torch.randn(4, 5, generator=gen(seed)).to(dt)
    info = torch.iinfo(dt)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), (3, 7), generator=gen(seed)).to(dt)


def case_A1(tz):
    return [("state_dict", {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3)})]


def case_A2(tz):
    return [
        ("state_dict", {"l0.w": randn(4, 4, seed=1), "l0.b": randn(4, seed=2)}),
        ("snapshot",),
        ("state_dict", {"l1.w": randn(3, 3, seed=3, dtype=torch.float64), "nested": {"x": randn(2, seed=4)}}),
        ("snapshot",),
        ("tensor", 7, "x.y", BUFFER, torch.arange(5, dtype=torch.int64)),
        ("snapshot",),
        ("tensor", 3, "p.q", PARAM, randn(2, 2, seed=5)),
    ]


def case_A3(tz):
    return [
        ("state_dict", {"f": randn(3, seed=1)}),
        ("snapshot",),
        ("state_dict", {"b": torch.tensor([1.0, -2.0, 3.5], dtype=torch.bfloat16)}),
    ]


def case_A4(tz):
    return [("state_dict", {"w": randn(8, 8, seed=3), "b": randn(8, seed=4)}), ("snapshot",)]


def case_B1(tz):
    return [("module", Nested(), {})]


def case_B2(tz):
    return [("module", Tied(), {})]


def case_B3(tz):
    return [("module", NonPersistent(), {"include_non_persistent_buffers": False})]


def case_B4(tz):
    return [("module", NonPersistent(), {})]


def case_B5(tz):
    return [("state_dict", Nested().state_dict())]


def case_B6(tz):
    return [
        (
            "state_dict",
            {
                "model": {"layer": [{"weight": randn(2, 2, seed=1)}, {"weight": randn(2, 2, seed=2)}]},
                "lm_head": randn(3, seed=3),
            },
        )
    ]


def case_B7_list(tz):
    return [("state_dict", [randn(2, seed=1), randn(3, seed=2)])]


def case_B7_tuple(tz):
    return [("state_dict", (randn(2, seed=1), {"a": randn(3, seed=2)}))]


def case_B8(tz):
    return [
        (
            "state_dict",
            {"unié": {"k😀": randn(2, seed=1), "q\"\\/\n\t\x01\x7f": randn(2, seed=2), "ctl\x1f": randn(1, seed=3)}},
        )
    ]


def case_B9(tz):
    return [("state_dict", {"naïve.wéight": randn(3, seed=1), "日本.語": randn(1, seed=2)})]


def case_B10(tz):
    return [("state_dict", {"a": {}, "b": randn(2, seed=1), "c": [], "d": {"e": {}, "f": randn(1, seed=2)}})]


def case_C1(tz):
    return [("state_dict", {str(dt).replace("torch.", ""): native_tensor(dt, i) for i, dt in enumerate(NATIVE)})]


def case_C2(tz):
    out = {}
    for i, dt in enumerate((torch.uint16, torch.uint32, torch.uint64)):
        out[str(dt)[6:]] = torch.randint(0, 30000, (6,), generator=gen(i)).to(dt)
    out["big_u64"] = torch.tensor([2**63 + 5, 1], dtype=torch.uint64)
    return [("state_dict", out)]


def case_C3(tz):
    return [
        (
            "state_dict",
            {
                "bf": torch.tensor([1.0, -2.0], dtype=torch.bfloat16),
                "bf2d": randn(5, 3, seed=4, dtype=torch.bfloat16),
            },
        )
    ]


def case_C4(tz):
    return [("state_dict", {"c32": torch.tensor([1 + 2j, -0.5 + 0.25j], dtype=torch.complex32)})]


def case_C5(tz):
    return [("state_dict", {str(dt)[6:]: opaque_tensor(dt, 9, i) for i, dt in enumerate(dtypes_available(FLOAT8))})]


def case_C6(tz):
    return [("state_dict", {str(dt)[6:]: opaque_tensor(dt, 6, i) for i, dt in enumerate(dtypes_available(BITS))})]


def case_C6_subbyte(tz):
    return [("state_dict", {str(dt)[6:]: opaque_tensor(dt, 5, i) for i, dt in enumerate(dtypes_available(SUBBYTE))})]


def case_C8(tz):
    a = numpy.arange(12, dtype=numpy.float32).reshape(3, 4)
    return [
        ("tensor", 7, "np.arr", BUFFER, numpy.arange(3, dtype=numpy.int16)),
        ("tensor", 0, "np.f32", PARAM, a),
        ("tensor", 1, "np.t", STATE_DICT, a.T),  # non-contiguous array
        ("tensor", 2, "np.bool", BUFFER, numpy.array([True, False, True])),
    ]


def case_D1(tz):
    return [
        (
            "state_dict",
            {
                "s": torch.tensor(3.5, dtype=torch.float64),
                "i": torch.tensor(-7, dtype=torch.int32),
                "bf": torch.tensor(1.5, dtype=torch.bfloat16),
            },
        )
    ]


def case_D2(tz):
    return [
        (
            "state_dict",
            {
                "e04": torch.zeros((0, 4), dtype=torch.float16),
                "e0": torch.zeros(0),
                "e40": torch.zeros((4, 0)),
                "after": randn(2, seed=1),
            },
        )
    ]


def case_D3(tz):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return [
        (
            "state_dict",
            {
                "t": torch.arange(6, dtype=torch.int32).reshape(2, 3).t(),
                "strided": base[::2, 1::3],
                "expanded": torch.arange(3, dtype=torch.int16).expand(2, 3),
            },
        )
    ]


def case_D4(tz):
    shape = (2,) * 5 + (1,) * 27
    return [("state_dict", {"many": torch.arange(32, dtype=torch.float32).reshape(shape)})]


def case_E1(tz):
    return [
        (
            "state_dict",
            {"m": torch.empty((3, 4), device="meta"), "r": torch.ones(2), "mi": torch.empty(5, dtype=torch.int64, device="meta")},
        )
    ]


def case_E2(tz):
    return [("module", meta_module(tz), {})]


def case_H1(tz):
    t = randn(3, seed=1)
    return [
        ("state_dict", {"a": t}),
        ("snapshot",),
        ("state_dict", {"long": torch.empty(2**32 + 5, dtype=torch.int8, device="meta"), "b": randn(2, seed=2)}),
        ("state_dict", {"c": randn(1, seed=3)}),
    ]


def case_M1(tz):
    """~8 MiB random model."""
    tensors = {}
    for i in range(8):
        tensors[f"layers.{i}.weight"] = randn(512, 512, seed=100 + i)  # 1 MiB each
        tensors[f"layers.{i}.bias"] = randn(512, seed=200 + i)
    tensors["head.idx"] = torch.randint(0, 100, (1000,), generator=gen(5))
    tensors["head.half"] = randn(1000, seed=6, dtype=torch.float16)
    return [("state_dict", tensors)]


def case_E3(tz):
    """meta + opaque dtype: upstream writes it but cannot open it."""
    return [("state_dict", {"m": torch.empty((2, 3), dtype=torch.bfloat16, device="meta"), "r": torch.ones(2)})]


def case_E4(tz):
    """empty opaque (non-meta) tensor: upstream writes it but cannot open it."""
    return [("state_dict", {"e": torch.empty((0,), dtype=torch.bfloat16), "r": torch.ones(2)})]


def case_E5(tz):
    """0-dim meta tensor: upstream records data length 4 and never writes the data."""
    return [("state_dict", {"s": torch.empty((), device="meta"), "r": torch.ones(2)})]


def case_B14(tz):
    return [("state_dict", {"\x1e[1]": torch.ones(2)})]


def case_B14b(tz):
    return [("state_dict", {"\x1eabc": torch.ones(2)})]


def case_B15(tz):
    return [("state_dict", {"": torch.ones(2)})]


CASES: Dict[str, Callable] = {
    name[len("case_"):]: fn for name, fn in sorted(globals().items()) if name.startswith("case_")
}

# Written by upstream, but upstream's own reader raises TypeError on them.
UPSTREAM_UNREADABLE = ("E3", "E4")
# Names upstream writes but cannot (or can only wrongly) read back; ours
# refuses them at write time with ValueError.
REFUSED_BY_OURS = ("B14", "B14b", "B15")
# Not reproducible byte for byte (upstream hashes uninitialized memory).
NOT_DETERMINISTIC = ("E5",)
# Everything else: both directions and byte equality.
MATRIX = tuple(
    n for n in CASES if n not in UPSTREAM_UNREADABLE + REFUSED_BY_OURS + NOT_DETERMINISTIC
)

# Extra expectations checked on the raw files: version, flags.
FILE_INFO: Dict[str, Dict[str, Any]] = {
    "A1": {"version": 1, "size": 262327},
    "A2": {"version": 1},
    "A3": {"version": 2, "snapshots": [1]},
    "A4": {"version": 1},
    "C1": {"version": 1},
    "C2": {"version": 1},
    "C3": {"version": 2},
    "C4": {"version": 2},
    "C5": {"version": 2},
    "C6": {"version": 2},
    "D2": {"version": 1},
    "E1": {"version": 4, "flags": 0},
    "E2": {"version": 4, "flags": 0},
    "E3": {"version": 4, "flags": 0},
    "E4": {"version": 2, "flags": 0},
    "H1": {"version": 5, "flags": 2, "snapshots": [1]},
}

# Reader arguments: the 4 GiB meta tensor of H1 is not materialized.
READ_EXCLUDE: Dict[str, List[str]] = {"H1": ["long"]}


# --------------------------------------------------------------------------
# running a case


def write_case(tz, name: str, path: str) -> List[str]:
    """Write case ``name`` to ``path`` with ``tz``; returns the snapshot paths."""
    ops = CASES[name](tz)
    s = tz.TensorSerializer(path)
    snaps = []
    try:
        for op in ops:
            kind = op[0]
            if kind == "state_dict":
                s.write_state_dict(op[1])
            elif kind == "module":
                s.write_module(op[1], **op[2])
            elif kind == "tensor":
                s.write_tensor(op[1], op[2], tz.TensorType(op[3]), op[4])
            elif kind == "snapshot":
                snap = f"{path}.snap{len(snaps) + 1}"
                shutil.copyfile(path, snap)
                snaps.append(snap)
            else:
                raise AssertionError(kind)
    finally:
        s.close()
    return snaps


def _flatten(obj, prefix=()):
    if isinstance(obj, (torch.Tensor, numpy.ndarray)):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flatten(v, prefix + (k,))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _flatten(v, prefix + (i,))
    else:
        raise TypeError(type(obj))


def _module_entries(m: torch.nn.Module, include_non_persistent: bool):
    """(idx, type, name, tensor) in write_module order (FORMAT.md §4.2)."""
    out = []
    for idx, (mname, mod) in enumerate(m.named_modules()):
        for pname, p in mod.named_parameters(recurse=False):
            out.append((idx, PARAM, f"{mname}.{pname}", p))
        for bname, b in mod.named_buffers(recurse=False):
            if not include_non_persistent and bname in mod._non_persistent_buffers_set:
                continue
            out.append((idx, BUFFER, f"{mname}.{bname}", b))
    return out


def _entry(idx, ttype, name, t) -> Dict[str, Any]:
    return {
        "idx": idx,
        "type": ttype,
        "name": json_name(name),
        "dtype": dtype_name(t),
        "shape": list(t.shape),
        "sha256": sha(t),
    }


def expected_ops(ops, upto: int = None, exclude=()) -> List[Dict[str, Any]]:
    """Expected read-back, in file order, of the given ops (all, or the first ``upto``)."""
    out = []
    excl = {json.dumps(json_name(n)) for n in exclude}

    def entry(idx, ttype, name, t):
        if json.dumps(json_name(name)) in excl:
            return None
        return _entry(idx, ttype, name, t)

    for op in ops[:upto]:
        kind = op[0]
        if kind == "state_dict":
            for path, t in _flatten(op[1]):
                name = path[0] if len(path) == 1 and isinstance(path[0], str) else tuple(path)
                out.append(entry(0, STATE_DICT, name, t))
        elif kind == "module":
            for idx, tt, name, t in _module_entries(op[1], op[2].get("include_non_persistent_buffers", True)):
                out.append(entry(idx, tt, name, t))
        elif kind == "tensor":
            out.append(entry(op[1], op[3], op[2], op[4]))
    return [e for e in out if e is not None]


def expected(tz, name: str) -> Dict[str, Any]:
    """{"final": [...], "snapshots": [[...], ...]} for case ``name``."""
    ops = CASES[name](tz)
    excl = READ_EXCLUDE.get(name, ())
    snaps = [expected_ops(ops, i, excl) for i, op in enumerate(ops) if op[0] == "snapshot"]
    return {"final": expected_ops(ops, None, excl), "snapshots": snaps}


def describe(tz, path: str, exclude=(), verify_hash: bool = True) -> Dict[str, Any]:
    """What ``tz``'s reader returns for ``path`` (JSON-able)."""
    excl = set(exclude)
    ff = (lambda n: n not in excl) if excl else None
    # eager load with verification: everything is read in the constructor
    d = tz.TensorDeserializer(path, device="cpu", verify_hash=verify_hash, filter_func=ff)
    eager = {json.dumps(list(p)): sha(v) for p, v in walk(d)}
    keys = [k if isinstance(k, (str, int)) else repr(k) for k in d.keys()]
    d.close()
    d = tz.TensorDeserializer(path, device="cpu", lazy_load=True, verify_hash=verify_hash, filter_func=ff)
    tensors = []
    for idx, ttype, tname, t in d.read_tensors():
        e = _entry(int(idx), int(ttype), tname, t)
        e["requires_grad"] = bool(t.requires_grad)
        e["is_param"] = isinstance(t, torch.nn.Parameter)
        tensors.append(e)
    d.close()
    return {"keys": keys, "tensors": tensors, "eager_leaf_sha": eager}


def walk(mapping, prefix=()):
    """(path tuple, tensor) for every leaf of a (nested) Mapping."""
    for k in mapping.keys():
        v = mapping[k]
        if isinstance(v, torch.Tensor):
            yield prefix + (k,), v
        else:
            yield from walk(v, prefix + (k,))


def strip_extra(desc_tensors):
    return [{k: v for k, v in e.items() if k not in ("requires_grad", "is_param")} for e in desc_tensors]


def run_batch(tz, spec: Dict[str, Any]) -> Dict[str, Any]:
    """Execute a batch of writes and reads, catching errors per item."""
    res: Dict[str, Any] = {"write": {}, "describe": {}}
    for label, case, path in spec.get("write", []):
        try:
            res["write"][label] = {"ok": True, "snapshots": write_case(tz, case, path)}
        except Exception as e:  # noqa: BLE001
            res["write"][label] = {"ok": False, "error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()}
    for label, path, kwargs in spec.get("describe", []):
        try:
            res["describe"][label] = {"ok": True, "desc": describe(tz, path, **kwargs)}
        except Exception as e:  # noqa: BLE001
            res["describe"][label] = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "etype": type(e).__name__,
                "tb": traceback.format_exc(),
            }
    return res


def main(argv=None):
    """``python -c 'import crosscases; crosscases.main()' spec.json out.json``."""
    import tensorizer

    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    res = run_batch(tensorizer, spec)
    with open(argv[1], "w") as f:
        json.dump(res, f)
