"""Live cross-compatibility tests against upstream tensorizer 2.12.1.

For every case in ``crosscases.MATRIX`` (VECTORS.md rows A-E, H, plus an
~8 MiB random model):

* upstream writes -> our reader returns the expected tensors (names, module
  index, type, dtype, shape, bytes) with ``verify_hash=True``;
* our writer -> upstream's reader (``verify_hash=True``) returns them too;
* our file and upstream's file are byte-identical (also the copies taken
  between write calls), and both pass an independent hash recomputation.

All upstream work happens in a single subprocess per module (see the
``matrix`` fixture), since starting one costs ~2 s.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

import craft
import crosscases
import tensorizer

A1_SHA256 = "668e9705131715375605e91e604d186cd362a73286f4c1d99d0e57834a2ab291"

ALL_CASES = tuple(crosscases.CASES)
MATRIX = crosscases.MATRIX


def _snap_count(case: str) -> int:
    return sum(1 for op in crosscases.CASES[case](tensorizer) if op[0] == "snapshot")


def _describe_kwargs(case: str) -> dict:
    return {"exclude": crosscases.READ_EXCLUDE.get(case, [])}


class Matrix:
    def __init__(self, root: Path, ours_writes: dict, up: dict):
        self.root = root
        self.ours_writes = ours_writes  # case -> None | error string
        self.up = up  # upstream batch result

    def ours_path(self, case, snap=0) -> Path:
        p = self.root / "ours" / f"{case}.tensors"
        return p if not snap else Path(f"{p}.snap{snap}")

    def up_path(self, case, snap=0) -> Path:
        p = self.root / "up" / f"{case}.tensors"
        return p if not snap else Path(f"{p}.snap{snap}")

    def upstream_wrote(self, case):
        res = self.up["write"][case]
        if not res["ok"]:
            pytest.fail(f"upstream failed to write case {case}: {res['error']}\n{res['tb']}")

    def ours_wrote(self, case):
        err = self.ours_writes[case]
        if err is not None:
            pytest.fail(f"our writer failed on case {case}: {err}")

    def upstream_read(self, label):
        return self.up["describe"][label]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, upstream) -> Matrix:
    root = tmp_path_factory.mktemp("cross")
    (root / "ours").mkdir()
    (root / "up").mkdir()
    m = Matrix(root, {}, {})
    # 1. our writer, in this process
    for case in ALL_CASES:
        try:
            crosscases.write_case(tensorizer, case, str(m.ours_path(case)))
            m.ours_writes[case] = None
        except Exception as e:  # noqa: BLE001
            m.ours_writes[case] = f"{type(e).__name__}: {e}"
    # 2. upstream writes every case, then reads its own and our files
    spec = {"write": [[c, c, str(m.up_path(c))] for c in ALL_CASES], "describe": []}
    for c in ALL_CASES:
        for snap in range(_snap_count(c) + 1):
            spec["describe"].append([f"up:{c}:{snap}", str(m.up_path(c, snap)), _describe_kwargs(c)])
            if m.ours_writes[c] is None:
                spec["describe"].append([f"ours:{c}:{snap}", str(m.ours_path(c, snap)), _describe_kwargs(c)])
    (root / "spec.json").write_text(json.dumps(spec))
    upstream.run_upstream(
        "import crosscases; crosscases.main()",
        args=[root / "spec.json", root / "result.json"],
        cwd=root,
    )
    m.up = json.loads((root / "result.json").read_text())
    return m


def _expected(case):
    return crosscases.expected(tensorizer, case)


def _check_desc(desc, expected, what):
    got = crosscases.strip_extra(desc["tensors"])
    assert [e["name"] for e in got] == [e["name"] for e in expected], what
    for g, e in zip(got, expected):
        assert g == e, f"{what}: tensor {e['name']!r}"
    # the eager (constructor) load returned the same leaves
    eager = desc["eager_leaf_sha"]
    exp_eager = {
        json.dumps([e["name"]] if isinstance(e["name"], str) else e["name"]): e["sha256"] for e in expected
    }
    assert eager == exp_eager, f"{what}: eager load"


# ---------------------------------------------------------------------------
# (a) upstream writes -> we read


@pytest.mark.parametrize("case", MATRIX)
def test_ours_reads_upstream(matrix, case):
    matrix.upstream_wrote(case)
    exp = _expected(case)
    for snap in range(len(exp["snapshots"]) + 1):
        want = exp["final"] if snap == 0 else exp["snapshots"][snap - 1]
        desc = crosscases.describe(tensorizer, str(matrix.up_path(case, snap)), **_describe_kwargs(case))
        _check_desc(desc, want, f"{case} snapshot {snap}")


@pytest.mark.parametrize("case", MATRIX)
def test_ours_reader_matches_upstream_reader(matrix, case):
    """Same keys, requires_grad and Parameter-ness as upstream's reader on its own file."""
    matrix.upstream_wrote(case)
    ref = matrix.upstream_read(f"up:{case}:0")
    assert ref["ok"], ref.get("tb")
    desc = crosscases.describe(tensorizer, str(matrix.up_path(case)), **_describe_kwargs(case))
    assert desc == ref["desc"]


# ---------------------------------------------------------------------------
# (b) we write -> upstream reads (verify_hash=True)


@pytest.mark.parametrize("case", MATRIX)
def test_upstream_reads_ours(matrix, case):
    matrix.ours_wrote(case)
    exp = _expected(case)
    for snap in range(len(exp["snapshots"]) + 1):
        want = exp["final"] if snap == 0 else exp["snapshots"][snap - 1]
        res = matrix.upstream_read(f"ours:{case}:{snap}")
        assert res["ok"], f"upstream could not read our {case} (snapshot {snap}): {res['error']}\n{res['tb']}"
        _check_desc(res["desc"], want, f"{case} snapshot {snap}")


@pytest.mark.parametrize("case", MATRIX)
def test_ours_roundtrip(matrix, case):
    matrix.ours_wrote(case)
    exp = _expected(case)
    for snap in range(len(exp["snapshots"]) + 1):
        want = exp["final"] if snap == 0 else exp["snapshots"][snap - 1]
        desc = crosscases.describe(tensorizer, str(matrix.ours_path(case, snap)), **_describe_kwargs(case))
        _check_desc(desc, want, f"{case} snapshot {snap}")


# ---------------------------------------------------------------------------
# (c) byte equality and raw-file checks


@pytest.mark.parametrize("case", MATRIX + crosscases.UPSTREAM_UNREADABLE)
def test_byte_identical(matrix, case):
    matrix.upstream_wrote(case)
    matrix.ours_wrote(case)
    for snap in range(_snap_count(case) + 1):
        ours = matrix.ours_path(case, snap).read_bytes()
        theirs = matrix.up_path(case, snap).read_bytes()
        if ours != theirs:
            first = next(
                (i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs))
            )
            pytest.fail(
                f"{case} snapshot {snap}: files differ (ours {len(ours)} bytes, upstream"
                f" {len(theirs)} bytes), first difference at offset {first}:"
                f" ours {ours[first:first + 16].hex()} upstream {theirs[first:first + 16].hex()}"
            )


@pytest.mark.parametrize("who", ["up", "ours"])
@pytest.mark.parametrize("case", MATRIX + crosscases.UPSTREAM_UNREADABLE)
def test_file_structure(matrix, case, who):
    """Independent parse: version/flags, contiguous records, end marker, hashes (F1)."""
    if who == "up":
        matrix.upstream_wrote(case)
        path = matrix.up_path(case)
    else:
        matrix.ours_wrote(case)
        path = matrix.ours_path(case)
    data = path.read_bytes()
    tz, lay = craft.parse(data)
    info = crosscases.FILE_INFO.get(case, {})
    if "version" in info:
        assert lay.version == info["version"]
    assert lay.flags == info.get("flags", 2 if lay.version >= 5 else 0)
    assert lay.metadata_len == craft.DEFAULT_METADATA_LEN
    assert lay.end_marker is not None and lay.end_marker + 8 == len(data)
    assert tz.trailing == b""
    if "size" in info:
        assert len(data) == info["size"]
    # tensor_size = sum of the data bytes written
    assert lay.tensor_size == sum(len(r.data) for r in tz.records)
    # entries agree with the records
    for e, s in zip(tz.entries, lay.records):
        assert (e.header_offset, e.data_offset) == (s.header_start, s.header_end)
    for name, ok in craft.verify_record_hashes(data):
        assert ok, f"stored hash of {name!r} does not match a recomputation"
    # the file re-serializes to itself from the model (offsets recomputed)
    assert craft.relayout(tz).to_bytes() == data
    for snap in range(1, _snap_count(case) + 1):
        p = matrix.up_path(case, snap) if who == "up" else matrix.ours_path(case, snap)
        _, slay = craft.parse(p.read_bytes())
        snaps_v = info.get("snapshots")
        if snaps_v:
            assert slay.version == snaps_v[snap - 1]


def test_a1_exact_bytes(matrix):
    for path in (matrix.up_path("A1"), matrix.ours_path("A1")):
        data = path.read_bytes()
        assert len(data) == 262327
        assert hashlib.sha256(data).hexdigest() == A1_SHA256


def test_a1_matches_independent_writer(matrix):
    ref = craft.simple_file({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3)}).to_bytes()
    assert hashlib.sha256(ref).hexdigest() == A1_SHA256
    assert matrix.ours_path("A1").read_bytes() == ref


def test_a2_layout(matrix):
    """Entries are appended in order; the count, size and end marker move with each call."""
    for who in ("up", "ours"):
        getattr(matrix, "upstream_wrote" if who == "up" else "ours_wrote")("A2")
        path_of = matrix.up_path if who == "up" else matrix.ours_path
        counts = []
        for snap in (1, 2, 3, 0):
            data = path_of("A2", snap).read_bytes()
            tz, lay = craft.parse(data)
            counts.append(lay.tensor_count)
            assert lay.end_marker + 8 == len(data)
        assert counts == [2, 4, 5, 6]
        tz, lay = craft.parse(path_of("A2").read_bytes())
        assert [r.name for r in tz.records] == [b"l0.w", b"l0.b", b"l1.w", b'\x1e["nested","x"]', b"x.y", b"p.q"]
        assert [(r.module_idx, r.tensor_type) for r in tz.records][-2:] == [(7, 1), (3, 0)]


def test_a4_snapshot_equals_closed_file(matrix):
    """After a completed write call the file is already final (close changes nothing)."""
    for path_of in (matrix.up_path, matrix.ours_path):
        assert path_of("A4", 1).read_bytes() == path_of("A4").read_bytes()


def test_h1_long_dimension_layout(matrix):
    for who in ("up", "ours"):
        getattr(matrix, "upstream_wrote" if who == "up" else "ours_wrote")("H1")
        path_of = matrix.up_path if who == "up" else matrix.ours_path
        tz, lay = craft.parse(path_of("H1").read_bytes())
        assert (lay.version, lay.flags) == (5, craft.FLAG_VERSIONED_HEADERS)
        assert [e.tag for e in tz.entries] == [1, 5, 1, 1]
        long = tz.records[1]
        assert long.name == b"long" and long.shape == (2**32 + 5,) and long.long_dims
        assert long.data_length == 0 and long.dtype == b"|i1"
        # the header stores the dim as a u64
        assert craft.u64(2**32 + 5) in long.build_header()
        # before the long tensor arrived, the file was a plain v1 file
        _, slay = craft.parse(path_of("H1", 1).read_bytes())
        assert (slay.version, slay.flags) == (1, 0)


def test_h1_long_meta_tensor_metadata(matrix):
    """Our reader knows the shape/dtype of the 2**32+5 meta tensor without materializing it."""
    matrix.upstream_wrote("H1")
    d = tensorizer.TensorDeserializer(str(matrix.up_path("H1")), device="cpu", lazy_load=True)
    try:
        assert list(d.keys()) == ["a", "long", "b", "c"]
        assert "long" in d and len(d) == 4
    finally:
        d.close()


# ---------------------------------------------------------------------------
# quirk cases: files upstream writes but cannot read, names ours refuses


@pytest.mark.ours_only
@pytest.mark.parametrize("case", crosscases.UPSTREAM_UNREADABLE)
def test_ours_reads_upstream_opaque_meta_and_empty(matrix, case):
    """E3/E4: upstream cannot open these (TypeError); ours loads zeros / empty tensors."""
    matrix.upstream_wrote(case)
    exp = _expected(case)
    desc = crosscases.describe(tensorizer, str(matrix.up_path(case)))
    _check_desc(desc, exp["final"], case)
    d = tensorizer.TensorDeserializer(str(matrix.up_path(case)), device="cpu")
    t = d["m"] if case == "E3" else d["e"]
    assert t.dtype == torch.bfloat16
    if case == "E3":
        assert t.shape == (2, 3) and not t.any()
    else:
        assert t.shape == (0,)


@pytest.mark.ours_only
@pytest.mark.parametrize("case", crosscases.UPSTREAM_UNREADABLE)
def test_ours_roundtrip_opaque_meta_and_empty(matrix, case):
    matrix.ours_wrote(case)
    exp = _expected(case)
    desc = crosscases.describe(tensorizer, str(matrix.ours_path(case)))
    _check_desc(desc, exp["final"], case)


@pytest.mark.parametrize("case", crosscases.UPSTREAM_UNREADABLE)
def test_upstream_cannot_read_opaque_meta_and_empty(matrix, case):
    """Documents the upstream limitation (FORMAT.md §3.3) for both writers' files."""
    matrix.upstream_wrote(case)
    res = matrix.upstream_read(f"up:{case}:0")
    assert not res["ok"] and res["etype"] == "TypeError", res
    if matrix.ours_writes[case] is None:
        res = matrix.upstream_read(f"ours:{case}:0")
        assert not res["ok"] and res["etype"] == "TypeError", res


def test_e5_zero_dim_meta_from_upstream(matrix):
    """Upstream's 0-dim meta quirk (data length 4, no data): loads as a zero scalar."""
    matrix.upstream_wrote("E5")
    data = matrix.up_path("E5").read_bytes()
    tz, lay = craft.parse(data)
    assert lay.version == 4
    assert tz.records[0].shape == () and tz.records[0].data_length == 4
    d = tensorizer.TensorDeserializer(str(matrix.up_path("E5")), device="cpu", verify_hash=False)
    assert d["s"].shape == () and d["s"].dtype == torch.float32 and d["s"].detach().item() == 0.0
    assert torch.equal(d["r"].data, torch.ones(2))


def test_b14_rs_prefixed_name_from_upstream(matrix):
    """Upstream writes the str key "\\x1e[1]" raw; every reader then sees the path (1,)."""
    matrix.upstream_wrote("B14")
    data = matrix.up_path("B14").read_bytes()
    assert craft.parse(data)[0].records[0].name == b"\x1e[1]"
    d = tensorizer.TensorDeserializer(str(matrix.up_path("B14")), device="cpu")
    assert list(d.keys()) == [1]
    assert torch.equal(d[1].data, torch.ones(2))


@pytest.mark.parametrize("case", ["B14b", "B15"])
def test_b14_b15_unreadable_names_from_upstream(matrix, case):
    """"\\x1eabc" (not a json-seq array) and "" (empty path) -> ValueError on open."""
    matrix.upstream_wrote(case)
    with pytest.raises(ValueError):
        tensorizer.TensorDeserializer(str(matrix.up_path(case)), device="cpu")
    res = matrix.upstream_read(f"up:{case}:0")
    assert not res["ok"] and res["etype"] == "ValueError", res


@pytest.mark.ours_only
@pytest.mark.parametrize("case", crosscases.REFUSED_BY_OURS)
def test_ours_refuses_unreadable_names(matrix, case):
    err = matrix.ours_writes[case]
    assert err is not None and err.startswith("ValueError"), err


@pytest.mark.ours_only
@pytest.mark.parametrize("name", ["", "\x1e[1]", "\x1eabc", "\x1e"])
@pytest.mark.parametrize("how", ["state_dict", "tensor"])
def test_ours_refuses_bad_names_at_write_time(tmp_path, name, how):
    """The empty name and top-level names starting with 0x1E cannot be read back: refused."""
    s = tensorizer.TensorSerializer(str(tmp_path / "x.tensors"))
    try:
        with pytest.raises(ValueError):
            if how == "state_dict":
                s.write_state_dict({name: torch.ones(1)})
            else:
                s.write_tensor(0, name, tensorizer.TensorType.STATE_DICT, torch.ones(1))
    finally:
        s.close()


def test_nested_rs_and_empty_components_are_fine(tmp_path, upstream):
    """Inside a structured path, "" and "\\x1e..." components are JSON-escaped and round-trip."""
    p = tmp_path / "n.tensors"
    s = tensorizer.TensorSerializer(str(p))
    s.write_state_dict({"a": {"": torch.ones(1), "\x1e[1]": torch.zeros(2)}})
    s.close()
    tzf, _ = craft.parse(p.read_bytes())
    assert [r.name for r in tzf.records] == [b'\x1e["a",""]', b'\x1e["a","\\u001e[1]"]']
    d = tensorizer.TensorDeserializer(str(p), device="cpu", verify_hash=True)
    assert set(d["a"].keys()) == {"", "\x1e[1]"}
    out = upstream.run_upstream_json(
        """
        import sys, json, tensorizer
        d = tensorizer.TensorDeserializer(sys.argv[1], device="cpu", verify_hash=True)
        print(json.dumps(sorted(d["a"].keys())))
        """,
        args=[p],
    )
    assert out == ["", "\x1e[1]"]


# ---------------------------------------------------------------------------
# API-level cross checks that need upstream's writer


def test_read_tensors_module_idx_and_type_from_upstream(matrix):
    matrix.upstream_wrote("B1")
    d = tensorizer.TensorDeserializer(str(matrix.up_path("B1")), device="cpu", lazy_load=True)
    got = [(int(i), t, n) for i, t, n, _ in d.read_tensors()]
    assert got[:3] == [
        (0, tensorizer.TensorType.PARAM, ".w"),
        (0, tensorizer.TensorType.BUFFER, ".buf"),
        (1, tensorizer.TensorType.PARAM, "sub.b"),
    ]
    assert all(isinstance(t, tensorizer.TensorType) for _, t, _ in got)
    assert ("sub.lin.weight" in [n for _, _, n in got]) and ("seq.2.bias" in [n for _, _, n in got])


def test_structured_names_from_upstream(matrix):
    matrix.upstream_wrote("B6")
    d = tensorizer.TensorDeserializer(str(matrix.up_path("B6")), device="cpu")
    assert list(d.keys()) == ["model", "lm_head"]
    assert list(d["model"]["layer"].keys()) == [0, 1]
    tree = d.tree()
    assert isinstance(tree["model"]["layer"], list) and len(tree["model"]["layer"]) == 2
    ref = crosscases.CASES["B6"](tensorizer)[0][1]
    assert torch.equal(tree["model"]["layer"][1]["weight"].data, ref["model"]["layer"][1]["weight"])
    tzf, _ = craft.parse(matrix.up_path("B6").read_bytes())
    assert [r.name for r in tzf.records] == [
        b'\x1e["model","layer",0,"weight"]',
        b'\x1e["model","layer",1,"weight"]',
        b"lm_head",
    ]


def test_b8_escapes_from_upstream(matrix):
    matrix.upstream_wrote("B8")
    tzf, _ = craft.parse(matrix.up_path("B8").read_bytes())
    assert [r.name for r in tzf.records] == [
        b'\x1e["uni\\u00e9","k\\ud83d\\ude00"]',
        b'\x1e["uni\\u00e9","q\\"\\\\/\\n\\t\\u0001\\u007f"]',
        b'\x1e["uni\\u00e9","ctl\\u001f"]',
    ]
    d = tensorizer.TensorDeserializer(str(matrix.up_path("B8")), device="cpu")
    assert list(d["unié"].keys()) == ["k😀", "q\"\\/\n\t\x01\x7f", "ctl\x1f"]


def test_b9_plain_utf8_name_from_upstream(matrix):
    matrix.upstream_wrote("B9")
    tzf, _ = craft.parse(matrix.up_path("B9").read_bytes())
    assert tzf.records[0].name == "naïve.wéight".encode("utf-8")
    d = tensorizer.TensorDeserializer(str(matrix.up_path("B9")), device="cpu")
    assert list(d.keys()) == ["naïve.wéight", "日本.語"]


def test_b7_top_level_sequences(matrix):
    for case, keys in (("B7_list", [0, 1]), ("B7_tuple", [0, 1])):
        matrix.upstream_wrote(case)
        d = tensorizer.TensorDeserializer(str(matrix.up_path(case)), device="cpu")
        assert list(d.keys()) == keys
        assert isinstance(d.tree(), list)


def test_c8_numpy_dtype_strings(matrix):
    matrix.upstream_wrote("C8")
    tzf, _ = craft.parse(matrix.up_path("C8").read_bytes())
    assert [(r.name, r.dtype, r.module_idx, r.tensor_type) for r in tzf.records] == [
        (b"np.arr", b"<i2", 7, 1),
        (b"np.f32", b"<f4", 0, 0),
        (b"np.t", b"<f4", 1, 2),
        (b"np.bool", b"|b1", 2, 1),
    ]
    assert tzf.records[2].shape == (4, 3)


def test_dtype_strings_on_disk(matrix):
    """C1-C6 dtype strings as FORMAT.md §4.4 lists them."""
    matrix.upstream_wrote("C1")
    recs = {r.name: r.dtype for r in craft.parse(matrix.up_path("C1").read_bytes())[0].records}
    assert recs == {
        b"float16": b"<f2", b"float32": b"<f4", b"float64": b"<f8", b"complex64": b"<c8",
        b"complex128": b"<c16", b"int8": b"|i1", b"int16": b"<i2", b"int32": b"<i4",
        b"int64": b"<i8", b"uint8": b"|u1", b"bool": b"|b1",
    }
    recs = {r.name: r.dtype for r in craft.parse(matrix.up_path("C2").read_bytes())[0].records}
    assert recs[b"uint16"] == b"<u2" and recs[b"uint32"] == b"<u4" and recs[b"uint64"] == b"<u8"
    recs = {r.name: r.dtype for r in craft.parse(matrix.up_path("C3").read_bytes())[0].records}
    assert recs[b"bf"] == b"<V2\x00torch.bfloat16"
    recs = {r.name: r.dtype for r in craft.parse(matrix.up_path("C4").read_bytes())[0].records}
    assert recs[b"c32"] == b"<V4\x00torch.complex32"
    recs = {r.name: r.dtype for r in craft.parse(matrix.up_path("C5").read_bytes())[0].records}
    assert recs and all(v == b"|V1\x00torch." + k for k, v in recs.items())
    recs = {r.name: r.dtype for r in craft.parse(matrix.up_path("C6").read_bytes())[0].records}
    for k, v in recs.items():
        width = b"<V2" if k == b"bits16" else b"|V1"
        assert v == width + b"\x00torch." + k


def test_c5_c6_cover_what_torch_has():
    """The float8 / bits cases really contain every dtype this torch can hold."""
    have_f8 = [n for n in crosscases.FLOAT8 if isinstance(getattr(torch, n, None), torch.dtype)]
    assert len(crosscases.dtypes_available(crosscases.FLOAT8)) == len(have_f8) >= 4
    assert len(crosscases.dtypes_available(["bits8", "bits16"])) >= 1


def test_d4_many_dims_upstream_limit(tmp_path, upstream):
    """33+ dims: upstream's limit is numpy's (32 on numpy 1.x, 64 on 2.x)."""
    out = upstream.run_upstream_json(
        """
        import sys, json, torch, numpy, tensorizer
        res = {}
        for nd in (32, 64, 65):
            s = tensorizer.TensorSerializer(sys.argv[1] + f"/{nd}.tensors")
            try:
                s.write_state_dict({"t": torch.zeros((1,) * nd)})
                res[nd] = "ok"
            except Exception as e:
                res[nd] = type(e).__name__
            finally:
                s.close()
        print(json.dumps(res))
        """,
        args=[tmp_path],
    )
    assert out["32"] == "ok"
    for nd in (32, 64):
        if out[str(nd)] == "ok":
            d = tensorizer.TensorDeserializer(str(tmp_path / f"{nd}.tensors"), device="cpu", verify_hash=True)
            assert d["t"].shape == (1,) * nd
