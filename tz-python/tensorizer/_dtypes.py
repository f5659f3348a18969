"""
Mapping between torch dtypes and the dtype strings stored in tensorizer files
(FORMAT.md §4.4).

A stored dtype string is either a numpy typestr (``"<f4"``, ``"|b1"``...) for
dtypes numpy can represent, or, for "opaque" torch-only dtypes, the typestr of
a same-width integer with ``i`` replaced by ``V``, a NUL byte, and the torch
dtype's name with its ``torch.`` prefix (``"<V2\\0torch.bfloat16"``).
"""

import functools
import sys
import threading
from typing import NamedTuple, Optional

import numpy
import torch

__all__ = [
    "OPAQUE_DTYPE_SEP",
    "DecodedDType",
    "decode_dtype",
    "dtype_string_for_torch",
    "dtype_string_for_numpy",
    "is_opaque_torch_dtype",
    "torch_dtype_from_name",
]

OPAQUE_DTYPE_SEP = "\0"

# torch.empty may be patched by tensorizer.utils.no_init_or_tensor to create
# meta tensors; the underlying builtin never is.
_torch_empty = getattr(torch._C._VariableFunctions, "empty", torch.empty)

# Stand-in integer types for opaque data, by element width.
_INTERMEDIATE_TYPES = {
    1: torch.int8,
    2: torch.int16,
    4: torch.int32,
    8: torch.int64,
}


def _dtypes_named(*names):
    found = set()
    for name in names:
        dt = getattr(torch, name, None)
        if isinstance(dt, torch.dtype):
            found.add(dt)
    return frozenset(found)


# Torch dtypes that are always stored opaquely, even if a future numpy/torch
# combination could convert them (fixed list, as upstream keeps it).
_ASYMMETRIC_TYPES = _dtypes_named(
    "bfloat16",
    "quint8",
    "qint8",
    "qint32",
    "quint4x2",
    "quint2x4",
    "complex32",
    "bits1x8",
    "bits2x4",
    "bits4x2",
    "bits8",
    "bits16",
    "float8_e5m2",
    "float8_e4m3fn",
    "float8_e5m2fnuz",
    "float8_e4m3fnuz",
    "uint1",
    "uint2",
    "uint3",
    "uint4",
    "uint5",
    "uint6",
    "uint7",
    "int1",
    "int2",
    "int3",
    "int4",
    "int5",
    "int6",
    "int7",
    "float8_e8m0fnu",
)

# Quantized dtypes need extra parameters to be meaningful; never serialized.
_UNSUPPORTED_TYPES = _dtypes_named(
    "quint8", "qint8", "qint32", "quint4x2", "quint2x4"
)

# numpy (kind, itemsize) -> torch dtype, for native (non-opaque) data.
_NUMPY_TO_TORCH = {
    ("b", 1): torch.bool,
    ("i", 1): torch.int8,
    ("i", 2): torch.int16,
    ("i", 4): torch.int32,
    ("i", 8): torch.int64,
    ("u", 1): torch.uint8,
    ("f", 2): torch.float16,
    ("f", 4): torch.float32,
    ("f", 8): torch.float64,
    ("c", 8): torch.complex64,
    ("c", 16): torch.complex128,
}
for _kind, _size, _name in (("u", 2, "uint16"), ("u", 4, "uint32"), ("u", 8, "uint64")):
    _dt = getattr(torch, _name, None)
    if isinstance(_dt, torch.dtype):
        _NUMPY_TO_TORCH[(_kind, _size)] = _dt
del _kind, _size, _name, _dt

_NATIVE_BYTE_ORDER = "<" if sys.byteorder == "little" else ">"

_cache_lock = threading.Lock()
_encode_cache = {}


def is_opaque_torch_dtype(dtype: torch.dtype) -> bool:
    """Whether tensors of this torch dtype are stored opaquely."""
    return dtype_string_for_torch(dtype).find(OPAQUE_DTYPE_SEP) != -1


def _element_size(dtype: torch.dtype) -> int:
    itemsize = getattr(dtype, "itemsize", None)
    if itemsize is None:
        itemsize = _torch_empty((), dtype=dtype, device="cpu").element_size()
    return int(itemsize)


def _opaque_string(dtype: torch.dtype) -> str:
    size = _element_size(dtype)
    intermediate = _INTERMEDIATE_TYPES.get(size)
    if intermediate is None:
        raise ValueError(
            "Cannot create a numpy array with opaque elements of size"
            f" {size} bytes"
        )
    int_str = _torch_empty((0,), dtype=intermediate, device="cpu").numpy().dtype.str
    return int_str.replace("i", "V") + OPAQUE_DTYPE_SEP + str(dtype)


def dtype_string_for_torch(dtype: torch.dtype) -> str:
    """
    The dtype string a writer stores for a tensor of `dtype`.

    Raises:
        NotImplementedError: for quantized dtypes.
        ValueError: for an opaque dtype whose width has no integer stand-in.
    """
    cached = _encode_cache.get(dtype)
    if cached is not None:
        return cached
    if dtype in _UNSUPPORTED_TYPES:
        raise NotImplementedError(
            f"Serialization for {dtype} is not implemented."
        )
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"Expected a torch.dtype, got {dtype!r}")
    result: Optional[str] = None
    if dtype not in _ASYMMETRIC_TYPES:
        try:
            result = (
                _torch_empty((0,), dtype=dtype, device="cpu").numpy().dtype.str
            )
        except TypeError:
            # No numpy equivalent in this torch version: store opaquely
            result = None
    if result is None:
        result = _opaque_string(dtype)
    with _cache_lock:
        _encode_cache[dtype] = result
    return result


def dtype_string_for_numpy(dtype: numpy.dtype) -> str:
    """
    The dtype string a writer stores for a numpy array of `dtype`.

    Raises:
        TypeError: if torch cannot represent the dtype (it could not be
            deserialized later).
    """
    dtype = numpy.dtype(dtype)
    try:
        torch.from_numpy(numpy.empty((), dtype=dtype))
    except TypeError as e:
        raise TypeError(
            f"Cannot serialize an array with dtype {dtype.name}"
            " as a _NumpyTensor."
        ) from e
    return dtype.str


@functools.lru_cache(maxsize=None)
def torch_dtype_from_name(name: str) -> torch.dtype:
    """Parse ``"torch.<name>"`` into a torch dtype (ValueError if invalid)."""
    if not isinstance(name, str):
        raise TypeError("torch_dtype must be a string.")
    if not name:
        raise ValueError("Cannot decode an empty dtype.")
    module, *dtype_name = name.split(".", 1)
    if module != "torch" or len(dtype_name) != 1:
        raise ValueError(f"Invalid torch_dtype: {name}")
    dtype = getattr(torch, dtype_name[0], None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"Invalid torch_dtype: {name}")
    return dtype


class DecodedDType(NamedTuple):
    """What a stored dtype string means for a reader."""

    text: str  # the full stored string
    numpy_str: str  # the part before the NUL separator
    torch_str: Optional[str]  # the part after it (e.g. "torch.bfloat16")
    is_opaque: bool  # numpy part is a void type
    torch_dtype: torch.dtype  # dtype of the tensor to build (host order)
    numpy_view: numpy.dtype  # numpy dtype of the raw data (int for opaque)
    itemsize: int
    byteswap: bool  # stored in non-host byte order (libtensorizer swaps on read)


@functools.lru_cache(maxsize=1024)
def decode_dtype(text: str) -> DecodedDType:
    """
    Interpret a stored dtype string.

    Raises:
        ValueError: for multiple separators, an opaque type without a torch
            dtype, or an invalid torch dtype name.
        TypeError: for a numpy type that torch cannot represent.
    """
    numpy_str, *torch_part = text.split(OPAQUE_DTYPE_SEP)
    if not torch_part:
        torch_str = None
    elif len(torch_part) == 1:
        torch_str = torch_part[0]
    else:
        raise ValueError(
            "Can't deserialize a tensor with multiple opaque dtype separators"
            f" ({OPAQUE_DTYPE_SEP!r}) in its dtype: {text!r}"
        )
    np_dtype = numpy.dtype(numpy_str)
    is_opaque = np_dtype.type == numpy.void
    if is_opaque:
        view = numpy.dtype(numpy_str.replace("V", "i"))
        if not torch_str:
            raise ValueError(
                "Tried to decode a tensor stored as opaque data, but no"
                " torch dtype was specified"
            )
        torch_dtype = torch_dtype_from_name(torch_str)
        if torch_dtype in _UNSUPPORTED_TYPES:
            raise NotImplementedError(
                f"Deserialization for {torch_dtype} is not implemented."
            )
        if _element_size(torch_dtype) != view.itemsize:
            raise ValueError(
                f"Invalid opaque dtype {text!r}: {torch_str} elements are"
                f" {_element_size(torch_dtype)} bytes, not {view.itemsize}"
            )
    else:
        view = np_dtype
        torch_dtype = _NUMPY_TO_TORCH.get((np_dtype.kind, np_dtype.itemsize))
        if torch_dtype is None:
            raise TypeError(
                f"can't convert np.ndarray of type {np_dtype} to a torch tensor"
            )
    byteswap = (
        view.byteorder not in ("=", "|", _NATIVE_BYTE_ORDER)
        and view.itemsize > 1
    )
    if byteswap:
        view = view.newbyteorder("=")
    return DecodedDType(
        text=text,
        numpy_str=numpy_str,
        torch_str=torch_str,
        is_opaque=is_opaque,
        torch_dtype=torch_dtype,
        numpy_view=view,
        itemsize=view.itemsize,
        byteswap=byteswap,
    )
