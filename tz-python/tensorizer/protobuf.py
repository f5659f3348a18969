"""
Upstream's legacy protobuf serializer (schema ``tensors.proto``), kept so code
that uses it runs unchanged. It does not read or write the tensorizer format;
``TensorSerializer`` / ``TensorDeserializer`` are the fast path.

Messages are wire-compatible with upstream's in both directions. Beyond
upstream: bfloat16 and complex32 tensors round-trip (they go through raw bytes,
not numpy, which lacks those types), ``serialize_model`` prints nothing, a
message whose data does not match its dtype and shape raises ``ValueError``
instead of producing a wrong tensor, and parameters come back as
``torch.nn.Parameter``. Tensor data is stored in the machine's byte order
(little-endian everywhere torch runs in practice), as upstream stores it.
"""

from typing import BinaryIO, Dict, Optional, Tuple, Union

import numpy as np
import torch

from . import tensors_pb2

__all__ = [
    "serialize_tensor",
    "deserialize_tensor",
    "serialize_model",
    "deserialize_model",
    "DtypePbs",
    "PbDtypes",
    "PbNpyDtypes",
]

DtypePbs: Dict[torch.dtype, int] = {
    torch.float32: tensors_pb2.DT_FLOAT32,
    torch.float64: tensors_pb2.DT_FLOAT64,
    torch.float16: tensors_pb2.DT_FLOAT16,
    torch.bfloat16: tensors_pb2.DT_BFLOAT16,
    torch.complex32: tensors_pb2.DT_COMPLEX32,
    torch.complex64: tensors_pb2.DT_COMPLEX64,
    torch.complex128: tensors_pb2.DT_COMPLEX128,
    torch.uint8: tensors_pb2.DT_UINT8,
    torch.int8: tensors_pb2.DT_INT8,
    torch.int16: tensors_pb2.DT_INT16,
    torch.int32: tensors_pb2.DT_INT32,
    torch.int64: tensors_pb2.DT_INT64,
    torch.bool: tensors_pb2.DT_BOOL,
    torch.quint8: tensors_pb2.DT_QUINT8,
    torch.qint8: tensors_pb2.DT_QINT8,
    torch.qint32: tensors_pb2.DT_QINT32,
    torch.quint4x2: tensors_pb2.DT_QUINT4_2,
}
PbDtypes: Dict[int, torch.dtype] = {code: dtype for dtype, code in DtypePbs.items()}

# numpy views of the codes numpy can represent (it has no bfloat16, complex32
# or quantized types).
PbNpyDtypes: Dict[int, type] = {
    tensors_pb2.DT_FLOAT32: np.float32,
    tensors_pb2.DT_FLOAT64: np.float64,
    tensors_pb2.DT_FLOAT16: np.float16,
    tensors_pb2.DT_COMPLEX64: np.complex64,
    tensors_pb2.DT_COMPLEX128: np.complex128,
    tensors_pb2.DT_UINT8: np.uint8,
    tensors_pb2.DT_INT8: np.int8,
    tensors_pb2.DT_INT16: np.int16,
    tensors_pb2.DT_INT32: np.int32,
    tensors_pb2.DT_INT64: np.int64,
    tensors_pb2.DT_BOOL: bool,
}

# The schema has no fields for a quantized tensor's scale and zero point, so
# quantized codes (which other writers may use) decode to the stored integers.
_QUANTIZED_STORAGE = {
    tensors_pb2.DT_QUINT8: torch.uint8,
    tensors_pb2.DT_QINT8: torch.int8,
    tensors_pb2.DT_QINT32: torch.int32,
    tensors_pb2.DT_QUINT4_2: torch.uint8,
}

_ATTRIBUTE_TYPES = (tensors_pb2.AT_PARAMETER, tensors_pb2.AT_BUFFER)


def serialize_tensor(t: torch.Tensor, attribute: Optional[int] = None) -> "tensors_pb2.Tensor":
    """A ``tensors_pb2.Tensor`` holding `t`'s dtype, shape and bytes (copied
    to the CPU), tagged with `attribute` (``AT_PARAMETER`` or ``AT_BUFFER``)
    when given."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"serialize_tensor: expected a torch.Tensor, got {type(t).__name__}")
    if attribute is not None and attribute not in _ATTRIBUTE_TYPES:
        raise ValueError(f"serialize_tensor: attribute must be AT_PARAMETER, AT_BUFFER or None, got {attribute!r}")
    if t.is_quantized:
        raise TypeError("serialize_tensor: tensors.proto has no fields for a quantized tensor's scale and zero point")
    code = DtypePbs.get(t.dtype)
    if code is None:
        raise ValueError(f"serialize_tensor: tensors.proto has no code for dtype {t.dtype}")
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    extra = {} if attribute is None else {"attr_type": attribute}
    return tensors_pb2.Tensor(dtype=code, shape=list(t.shape), data=data, **extra)


def deserialize_tensor(t: "tensors_pb2.Tensor") -> Union[torch.Tensor, Tuple[torch.Tensor, int]]:
    """The tensor a ``tensors_pb2.Tensor`` holds, on the CPU, in memory of its
    own; ``(tensor, attr_type)`` when the message carries an attribute type."""
    dtype = PbDtypes.get(t.dtype)
    if dtype is None:
        raise ValueError(f"deserialize_tensor: unknown dtype code {t.dtype}")
    dtype = _QUANTIZED_STORAGE.get(t.dtype, dtype)
    shape = tuple(int(d) for d in t.shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"deserialize_tensor: negative dimension in shape {list(shape)}")
    count = 1
    for d in shape:
        count *= d
    itemsize = torch.empty((), dtype=dtype).element_size()
    if count * itemsize != len(t.data):
        raise ValueError(
            f"deserialize_tensor: shape {list(shape)} of {dtype} needs {count * itemsize} bytes,"
            f" the message holds {len(t.data)}"
        )
    if count == 0:
        tensor = torch.empty(shape, dtype=dtype)
    else:
        tensor = torch.frombuffer(bytearray(t.data), dtype=dtype).reshape(shape)
    if t.HasField("attr_type"):
        return tensor, t.attr_type
    return tensor


def serialize_model(model: torch.nn.Module, file_stream: BinaryIO) -> None:
    """Writes every module's own parameters and buffers to `file_stream` as
    one ``Module`` message whose attributes are the submodules by name."""
    modules = []
    for module_name, module in model.named_modules():
        attributes = [
            tensors_pb2.Attribute(name=name, tensor=serialize_tensor(p, tensors_pb2.AT_PARAMETER))
            for name, p in module.named_parameters(recurse=False)
        ]
        attributes += [
            tensors_pb2.Attribute(name=name, tensor=serialize_tensor(b, tensors_pb2.AT_BUFFER))
            for name, b in module.named_buffers(recurse=False)
        ]
        modules.append(tensors_pb2.Attribute(name=module_name, module=tensors_pb2.Module(attributes=attributes)))
    file_stream.write(tensors_pb2.Module(name="", attributes=modules).SerializeToString())


def deserialize_model(model: torch.nn.Module, file_stream: BinaryIO) -> None:
    """Reads what ``serialize_model`` wrote into `model`, replacing the named
    parameters and buffers of its modules."""
    message = tensors_pb2.Module()
    message.ParseFromString(file_stream.read())
    modules = dict(model.named_modules())
    for module_attr in message.attributes:
        module = modules.get(module_attr.name)
        if module is None:
            raise KeyError(f"deserialize_model: the model has no module named {module_attr.name!r}")
        for attr in module_attr.module.attributes:
            if attr.WhichOneof("value") != "tensor" or not attr.tensor.HasField("attr_type"):
                continue
            tensor, kind = deserialize_tensor(attr.tensor)
            if kind == tensors_pb2.AT_PARAMETER:
                old = module._parameters.get(attr.name)
                differentiable = tensor.is_floating_point() or tensor.is_complex()
                requires_grad = differentiable and (old.requires_grad if old is not None else True)
                module._parameters[attr.name] = torch.nn.Parameter(tensor, requires_grad=requires_grad)
            elif kind == tensors_pb2.AT_BUFFER:
                module._buffers[attr.name] = tensor
            else:
                raise ValueError(f"deserialize_model: unknown attribute type {kind}")
