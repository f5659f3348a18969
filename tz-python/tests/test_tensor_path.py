import json
import types

import pytest
import torch

from tensorizer import _tensor_path as tp


class TestEncode:
    def test_plain_string_is_raw_utf8(self):
        assert tp.encode_path("model.weight") == b"model.weight"
        assert tp.encode_path(("model.weight",)) == b"model.weight"
        assert tp.encode_path("unié") == "unié".encode("utf-8")

    def test_structured_examples_from_format_md(self):
        assert (
            tp.encode_path(("model", "layer", 0, "weight"))
            == b'\x1e["model","layer",0,"weight"]'
        )
        assert tp.encode_path((0,)) == b"\x1e[0]"
        assert (
            tp.encode_path(("uni\u00e9", "k\U0001F600"))
            == b'\x1e["uni\\u00e9","k\\ud83d\\ude00"]'
        )

    def test_escapes(self):
        enc = tp.encode_path(("a\x7fb/\x01\u00e9", 'q"\\\n\t'))
        assert enc == b'\x1e["a\\u007fb/\\u0001\\u00e9","q\\"\\\\\\n\\t"]'
        # The JSON part round-trips through a standard parser
        assert json.loads(enc[1:]) == ["a\x7fb/\x01\u00e9", 'q"\\\n\t']

    def test_no_whitespace(self):
        assert b" " not in tp.encode_path(("a", 1, "b"))


class TestNormalize:
    def test_normalize(self):
        assert tp.normalize(("a",)) == "a"
        assert tp.normalize((0,)) == (0,)
        assert tp.normalize(("a", "b")) == ("a", "b")
        assert tp.is_str_path(("a",))
        assert not tp.is_str_path((1,))
        assert not tp.is_str_path(("a", "b"))

    def test_validate(self):
        tp.validate_path(("a", 0))
        with pytest.raises(ValueError):
            tp.validate_path(())
        with pytest.raises(ValueError):
            tp.validate_path(("a", -1))
        with pytest.raises(TypeError):
            tp.validate_path(("a", 1.5))


class TestFlatten:
    def test_nested(self):
        t = [torch.zeros(1) for _ in range(4)]
        obj = {"model": {"layer": [{"weight": t[0]}, {"weight": t[1]}]}, "lm_head": t[2]}
        flat = list(tp.flatten_structure(torch.Tensor, obj))
        assert [p for p, _ in flat] == [
            ("model", "layer", 0, "weight"),
            ("model", "layer", 1, "weight"),
            ("lm_head",),
        ]
        assert flat[0][1] is t[0]

    def test_list_and_tuple(self):
        a, b = torch.zeros(1), torch.ones(1)
        assert [p for p, _ in tp.flatten_structure(torch.Tensor, [a, (b,)])] == [
            (0,),
            (1, 0),
        ]

    def test_empty_containers(self):
        assert list(tp.flatten_structure(torch.Tensor, {"a": {}, "b": []})) == []

    def test_bad_key(self):
        with pytest.raises(TypeError, match="Invalid key type for state_dict"):
            list(tp.flatten_structure(torch.Tensor, {1: torch.zeros(1)}))

    def test_bad_leaf(self):
        with pytest.raises(TypeError, match="Cannot serialize type as part of a state_dict"):
            list(tp.flatten_structure(torch.Tensor, {"a": 3}))
        with pytest.raises(TypeError, match="Cannot serialize type"):
            list(tp.flatten_structure(torch.Tensor, {"a": "text"}))


class TestStructure:
    def test_build_structure_order(self):
        s = tp.build_structure([("b",), ("a", 0), ("a", 1), ("c", "x")])
        assert list(s) == ["b", "a", "c"]
        assert s["a"] == {0: ("a", 0), 1: ("a", 1)}
        assert s["b"] == ("b",)

    def test_build_structure_conflict(self):
        with pytest.raises(ValueError, match="Conflicting"):
            tp.build_structure([("a",), ("a", "b")])
        with pytest.raises(ValueError, match="Conflicting"):
            tp.build_structure([("a", "b"), ("a",)])

    def test_filter_structure(self):
        s = tp.build_structure([("b",), ("a", 0), ("a", 1)])
        f = tp.filter_structure(s, lambda p: p != ("a", 1))
        assert f == {"b": ("b",), "a": {0: ("a", 0)}}
        assert tp.filter_structure(s, lambda p: False) == {}

    def test_restructure_lists_and_gaps(self):
        flat = {("x", 5): "f", ("x", 0): "z", ("y",): "y"}
        out = tp.restructure(flat)
        assert out == {"x": ["z", "f"], "y": "y"}

    def test_restructure_top_level_list(self):
        assert tp.restructure({(1,): "b", (0,): "a"}) == ["a", "b"]

    def test_restructure_proxies(self):
        out = tp.restructure({("x", 0): 1, ("x", 1): 2}, use_dict_proxies=True)
        assert isinstance(out, types.MappingProxyType)
        assert isinstance(out["x"], types.MappingProxyType)
        assert dict(out["x"]) == {0: 1, 1: 2}

    def test_restructure_mixed_raises(self):
        with pytest.raises(ValueError):
            tp.restructure({("x", 0): 1, ("x", "a"): 2})
