import numpy
import pytest
import torch

from tensorizer import _dtypes

NATIVE = {
    torch.float16: "<f2",
    torch.float32: "<f4",
    torch.float64: "<f8",
    torch.complex64: "<c8",
    torch.complex128: "<c16",
    torch.int8: "|i1",
    torch.int16: "<i2",
    torch.int32: "<i4",
    torch.int64: "<i8",
    torch.uint8: "|u1",
    torch.bool: "|b1",
    # numpy equivalents exist in this torch: stored natively (FORMAT.md §4.4)
    torch.uint16: "<u2",
    torch.uint32: "<u4",
    torch.uint64: "<u8",
}

OPAQUE = {
    "bfloat16": "<V2\0torch.bfloat16",
    "complex32": "<V4\0torch.complex32",
    "float8_e5m2": "|V1\0torch.float8_e5m2",
    "float8_e4m3fn": "|V1\0torch.float8_e4m3fn",
    "float8_e5m2fnuz": "|V1\0torch.float8_e5m2fnuz",
    "float8_e4m3fnuz": "|V1\0torch.float8_e4m3fnuz",
    "float8_e8m0fnu": "|V1\0torch.float8_e8m0fnu",
    "bits8": "|V1\0torch.bits8",
    "bits16": "<V2\0torch.bits16",
    "uint4": "|V1\0torch.uint4",
    "int4": "|V1\0torch.int4",
    # Not in upstream's fixed list, but torch can't .numpy() it: opaque too
    "float4_e2m1fn_x2": "|V1\0torch.float4_e2m1fn_x2",
}


@pytest.mark.parametrize("dtype,expected", list(NATIVE.items()), ids=str)
def test_native_encode(dtype, expected):
    assert _dtypes.dtype_string_for_torch(dtype) == expected
    assert not _dtypes.is_opaque_torch_dtype(dtype)


@pytest.mark.parametrize("dtype,expected", list(NATIVE.items()), ids=str)
def test_native_decode(dtype, expected):
    d = _dtypes.decode_dtype(expected)
    assert d.torch_dtype == dtype
    assert not d.is_opaque
    assert d.torch_str is None
    assert d.itemsize == torch.empty((), dtype=dtype).element_size()
    assert not d.byteswap


@pytest.mark.parametrize("name,expected", list(OPAQUE.items()))
def test_opaque_roundtrip(name, expected):
    dtype = getattr(torch, name, None)
    if dtype is None:
        pytest.skip(f"torch.{name} not in this torch")
    assert _dtypes.dtype_string_for_torch(dtype) == expected
    assert _dtypes.is_opaque_torch_dtype(dtype)
    d = _dtypes.decode_dtype(expected)
    assert d.is_opaque
    assert d.torch_dtype == dtype
    assert d.torch_str == "torch." + name
    assert d.numpy_view == numpy.dtype(expected.split("\0")[0].replace("V", "i"))


@pytest.mark.parametrize(
    "text,dtype",
    [("<V2\0torch.uint16", torch.uint16), ("<V4\0torch.uint32", torch.uint32),
     ("<V8\0torch.uint64", torch.uint64)],
)
def test_reader_accepts_old_opaque_unsigned(text, dtype):
    # Older torch versions wrote uint16/32/64 opaquely
    d = _dtypes.decode_dtype(text)
    assert d.is_opaque and d.torch_dtype == dtype


def test_native_with_ignored_suffix():
    d = _dtypes.decode_dtype("<f4\0torch.float32")
    assert not d.is_opaque and d.torch_dtype == torch.float32


@pytest.mark.parametrize(
    "name", ["qint8", "quint8", "qint32", "quint4x2", "quint2x4"]
)
def test_quantized_refused(name):
    dtype = getattr(torch, name)
    with pytest.raises(NotImplementedError, match=f"Serialization for torch.{name} is not implemented."):
        _dtypes.dtype_string_for_torch(dtype)


def test_decode_errors():
    with pytest.raises(ValueError, match="multiple opaque dtype separators"):
        _dtypes.decode_dtype("<V2\0torch.bfloat16\0x")
    with pytest.raises(ValueError, match="no torch dtype was specified"):
        _dtypes.decode_dtype("<V2")
    with pytest.raises(ValueError, match="Invalid torch_dtype"):
        _dtypes.decode_dtype("<V2\0numpy.bfloat16")
    with pytest.raises(ValueError, match="Invalid torch_dtype"):
        _dtypes.decode_dtype("<V2\0torch.Tensor")


def test_big_endian_needs_swap():
    d = _dtypes.decode_dtype(">f4")
    assert d.byteswap and d.torch_dtype == torch.float32
    assert not _dtypes.decode_dtype(">i1").byteswap
    assert not _dtypes.decode_dtype("=f4").byteswap


def test_numpy_arrays():
    assert _dtypes.dtype_string_for_numpy(numpy.dtype("float32")) == "<f4"
    assert _dtypes.dtype_string_for_numpy(numpy.dtype("uint16")) == "<u2"
    with pytest.raises(TypeError, match="Cannot serialize an array with dtype"):
        _dtypes.dtype_string_for_numpy(numpy.dtype("U4"))


def test_no_init_does_not_affect_encoding():
    from tensorizer.utils import no_init_or_tensor

    _dtypes._encode_cache.clear()
    with no_init_or_tensor():
        assert _dtypes.dtype_string_for_torch(torch.uint32) == "<u4"
        assert _dtypes.dtype_string_for_torch(torch.float8_e5m2fnuz) == "|V1\0torch.float8_e5m2fnuz"
