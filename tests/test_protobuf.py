"""``tensorizer.protobuf`` / ``tensorizer.tensors_pb2``: upstream's legacy
protobuf serializer. Messages match upstream's byte for byte and cross-load
both ways; dtypes upstream cannot handle (bfloat16, complex32) round-trip
here; malformed messages raise ``ValueError``."""

from __future__ import annotations

import io

import pytest
import torch

import tensorizer
from tensorizer import protobuf, tensors_pb2
from protobuf_model import model as _model
from upstream import run_upstream


def test_submodules_are_exported():
    assert "protobuf" in tensorizer.__all__ and "tensors_pb2" in tensorizer.__all__
    assert tensorizer.protobuf is protobuf and tensorizer.tensors_pb2 is tensors_pb2
    assert tensors_pb2.Dtype.Name(tensors_pb2.DT_BFLOAT16) == "DT_BFLOAT16"
    assert tensors_pb2.AT_BUFFER == 1


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.float16, torch.complex64, torch.complex128, torch.uint8,
     torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
     # Upstream goes through numpy, which has neither of these.
     pytest.param(torch.bfloat16, marks=pytest.mark.ours_only),
     pytest.param(torch.complex32, marks=pytest.mark.ours_only)],
)
def test_tensor_round_trip(dtype):
    source = (torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) - 7).to(dtype)
    view = source.transpose(0, 2)  # not contiguous: serialized in logical order
    message = protobuf.serialize_tensor(view, tensors_pb2.AT_BUFFER)
    back, kind = protobuf.deserialize_tensor(tensors_pb2.Tensor.FromString(message.SerializeToString()))
    assert kind == tensors_pb2.AT_BUFFER and back.dtype == dtype and back.shape == view.shape
    assert torch.equal(back.view(torch.uint8), view.contiguous().view(torch.uint8))
    # Without an attribute type only the tensor comes back.
    plain = protobuf.deserialize_tensor(protobuf.serialize_tensor(view))
    assert isinstance(plain, torch.Tensor) and torch.equal(plain.view(torch.uint8), back.view(torch.uint8))


def test_scalars_and_empty_tensors():
    for t in (torch.tensor(2.5), torch.zeros(0, 3), torch.zeros(4, 0, dtype=torch.int32)):
        back = protobuf.deserialize_tensor(protobuf.serialize_tensor(t))
        assert back.shape == t.shape and back.dtype == t.dtype and torch.equal(back, t)


@pytest.mark.ours_only
def test_bad_messages_raise_value_error():
    ok = protobuf.serialize_tensor(torch.ones(2, 2))
    short = tensors_pb2.Tensor(dtype=ok.dtype, shape=[2, 2], data=ok.data[:-1])
    with pytest.raises(ValueError, match="needs 16 bytes"):
        protobuf.deserialize_tensor(short)
    with pytest.raises(ValueError, match="negative"):
        protobuf.deserialize_tensor(tensors_pb2.Tensor(dtype=ok.dtype, shape=[-2, -2], data=ok.data))
    with pytest.raises(ValueError, match="unknown dtype"):
        protobuf.deserialize_tensor(tensors_pb2.Tensor(dtype=tensors_pb2.DT_INVALID, shape=[1], data=b"x"))
    with pytest.raises(ValueError, match="no code"):
        protobuf.serialize_tensor(torch.ones(2, dtype=torch.uint16))
    with pytest.raises(TypeError):
        protobuf.serialize_tensor([1.0])
    with pytest.raises(TypeError, match="quantized"):
        protobuf.serialize_tensor(torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8))


@pytest.mark.ours_only
def test_model_round_trip_restores_parameters_and_buffers():
    src, dst = _model(1), _model(2)
    buf = io.BytesIO()
    protobuf.serialize_model(src, buf)
    buf.seek(0)
    protobuf.deserialize_model(dst, buf)
    for (name, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert torch.equal(a, b), name
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in dst.parameters())
    x = torch.tensor([[1, 2, 3]])
    assert torch.equal(src.block(src.embed(x)), dst.block(dst.embed(x)))


@pytest.mark.ours_only
def test_serialize_model_prints_nothing(capsys):
    protobuf.serialize_model(_model(1), io.BytesIO())
    assert capsys.readouterr().out == ""


@pytest.mark.ours_only
def test_unknown_module_names_fail_clearly():
    buf = io.BytesIO()
    protobuf.serialize_model(_model(1), buf)
    buf.seek(0)
    with pytest.raises(KeyError, match="no module named 'embed'"):
        protobuf.deserialize_model(torch.nn.Linear(2, 2), buf)


# The upstream interpreter builds the same seeded model from the same module.
_UPSTREAM_MODEL = """
import io, sys, torch
from tensorizer import protobuf
from protobuf_model import model as _model
"""


def test_messages_match_upstream_byte_for_byte(tmp_path):
    ours = io.BytesIO()
    protobuf.serialize_model(_model(1), ours)
    theirs = tmp_path / "upstream.pb"
    run_upstream(
        _UPSTREAM_MODEL
        + """
import contextlib
with open(sys.argv[1], "wb") as f, contextlib.redirect_stdout(io.StringIO()):
    protobuf.serialize_model(_model(1), f)
""",
        args=[theirs],
    )
    assert theirs.read_bytes() == ours.getvalue()


def test_cross_loading_with_upstream(tmp_path):
    # Upstream writes, we read.
    theirs = tmp_path / "upstream.pb"
    run_upstream(
        _UPSTREAM_MODEL
        + """
import contextlib
m = _model(3)
with torch.no_grad():
    m.steps.mul_(3)
with open(sys.argv[1], "wb") as f, contextlib.redirect_stdout(io.StringIO()):
    protobuf.serialize_model(m, f)
""",
        args=[theirs],
    )
    expected = _model(3)
    expected.steps.mul_(3)
    loaded = _model(4)
    with open(theirs, "rb") as f:
        protobuf.deserialize_model(loaded, f)
    for (name, a), (_, b) in zip(expected.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name

    # We write, upstream reads and checks against the same seeded model.
    ours = tmp_path / "ours.pb"
    with open(ours, "wb") as f:
        protobuf.serialize_model(expected, f)
    run_upstream(
        _UPSTREAM_MODEL
        + """
expected = _model(3)
expected.steps.mul_(3)
loaded = _model(4)
with open(sys.argv[1], "rb") as f:
    protobuf.deserialize_model(loaded, f)
for (name, a), (_, b) in zip(expected.state_dict().items(), loaded.state_dict().items()):
    assert torch.equal(a, b), name
""",
        args=[ours],
    )
