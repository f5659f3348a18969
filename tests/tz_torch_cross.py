"""Python side of the tz-torch cross test (tests/test_tz_torch.py).

``write(dir)`` writes py_*.tensors with whichever ``tensorizer`` is importable
(this package, or upstream when run through ``upstream.run_upstream``);
tz-torch's hidden ``[cross]`` Catch2 case checks them and writes cpp_*.tensors,
which ``check(dir)`` loads back. The contents mirror
tz-torch/tests/test_torch.cpp: keep the two in step.
"""

import json
import math
import os
import sys

import torch

# Every dtype the format can carry, in test_torch.cpp's dtype_cases() order.
DTYPES = [
    "float16", "float32", "float64", "bfloat16", "complex32", "complex64", "complex128",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2",
    "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7",
    "int1", "int2", "int3", "int4", "int5", "int6", "int7",
]


def _itemsize(dtype):
    return torch.empty((), dtype=dtype).element_size()


def pattern(dtype, shape, seed, fill=True):
    """Byte i = (7 i + 3 + 11 seed) mod 256 ((i + seed) mod 2 for bool), as dtype."""
    n = math.prod(shape) * _itemsize(dtype)
    if not fill:
        data = [0] * n
    elif dtype is torch.bool:
        data = [(i + seed) % 2 for i in range(n)]
    else:
        data = [(i * 7 + 3 + 11 * seed) % 256 for i in range(n)]
    return torch.tensor(data, dtype=torch.uint8).view(dtype).reshape(shape)


def same(a, b):
    """Same dtype, shape and bytes (NaN-proof)."""
    a, b = a.detach().contiguous(), b.detach().contiguous()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def dtype_state_dict():
    return {name: pattern(getattr(torch, name), (3, 2), k) for k, name in enumerate(DTYPES)}


def demo(fill=True):
    """test_torch.cpp's Demo: root, nested and shared submodules, params and buffers."""

    def param(dtype, shape, seed):
        return torch.nn.Parameter(pattern(dtype, shape, seed, fill), requires_grad=False)

    inner = torch.nn.Module()
    inner.register_parameter("b", param(torch.complex64, (2, 2), 6))
    enc = torch.nn.Module()
    enc.register_parameter("w", param(torch.float16, (4, 2), 3))
    enc.register_buffer("mask", pattern(torch.bool, (5,), 4, fill))
    enc.register_buffer("scale", pattern(torch.float8_e4m3fn, (2,), 5, fill))
    enc.add_module("inner", inner)
    dec = torch.nn.Module()
    dec.register_parameter("w", param(torch.float64, (3,), 7))
    dec.register_parameter("z", param(torch.float32, (0, 4), 8))
    dec.register_buffer("cplx", pattern(torch.complex32, (2,), 9, fill))
    root = torch.nn.Module()
    root.register_parameter("weight", param(torch.float32, (2, 3), 0))
    root.register_parameter("bias", param(torch.bfloat16, (3,), 1))
    root.register_buffer("steps", pattern(torch.int64, (), 2, fill))
    root.add_module("enc", enc)
    root.add_module("dec", dec)
    root.add_module("tied", inner)
    return root


def nested_state_dict():
    return {
        "layers": [
            {"w": pattern(torch.bfloat16, (2, 2), 0), "b": pattern(torch.complex32, (3,), 1)},
            {"w": pattern(torch.float8_e5m2, (4,), 2), "b": pattern(torch.float32, (2,), 3)},
        ],
        "head": {"scale": pattern(torch.float8_e4m3fnuz, (), 4)},
        "plain.name": pattern(torch.int64, (2,), 5),
    }


def _write(path, method, obj, encryption=None):
    from tensorizer import TensorSerializer

    s = TensorSerializer(path, encryption=encryption) if encryption else TensorSerializer(path)
    getattr(s, method)(obj)
    s.close()


def write(directory):
    from tensorizer import EncryptionParams

    d = str(directory)
    _write(os.path.join(d, "py_module.tensors"), "write_module", demo())
    _write(os.path.join(d, "py_dtypes.tensors"), "write_state_dict", dtype_state_dict())
    _write(os.path.join(d, "py_nested.tensors"), "write_state_dict", nested_state_dict())
    key = os.urandom(32)
    with open(os.path.join(d, "key.bin"), "wb") as f:
        f.write(key)
    _write(os.path.join(d, "py_enc.tensors"), "write_state_dict", dtype_state_dict(),
           encryption=EncryptionParams(key))


def check(directory):
    """Load the cpp_* files and compare with the expected tensors; returns a count."""
    from tensorizer import DecryptionParams, TensorDeserializer

    d = str(directory)
    checked = 0

    m = demo(fill=False)
    with TensorDeserializer(os.path.join(d, "cpp_module.tensors"), device="cpu", verify_hash=True) as t:
        assert t.load_into_module(m) == 10
    expected = demo().state_dict()
    got = m.state_dict()
    assert list(got) == list(expected), (list(got), list(expected))
    for name, tensor in expected.items():
        assert same(got[name], tensor), name
        checked += 1

    for file, kwargs in (("cpp_dtypes.tensors", {}), ("cpp_enc.tensors", "key")):
        if kwargs == "key":
            with open(os.path.join(d, "key.bin"), "rb") as f:
                kwargs = {"encryption": DecryptionParams.from_key(f.read())}
        with TensorDeserializer(os.path.join(d, file), device="cpu", verify_hash=True, **kwargs) as t:
            assert list(t.keys()) == DTYPES, list(t.keys())
            for name, tensor in dtype_state_dict().items():
                assert same(t[name], tensor), (file, name)
                checked += 1

    with TensorDeserializer(os.path.join(d, "cpp_nested.tensors"), device="cpu", verify_hash=True) as t:
        want = nested_state_dict()
        for k in range(2):
            for leaf in ("w", "b"):
                assert same(t["layers"][k][leaf], want["layers"][k][leaf]), (k, leaf)
                checked += 1
        assert same(t["head"]["scale"], want["head"]["scale"])
        assert same(t["plain.name"], want["plain.name"])
        checked += 2
    return checked


if __name__ == "__main__":  # python tz_torch_cross.py write|check DIR
    result = {"write": write, "check": check}[sys.argv[1]](sys.argv[2])
    print(json.dumps(result))
