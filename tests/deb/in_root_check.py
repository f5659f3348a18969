"""Run inside the test root by in-root.sh with the distro python3: the
installed python3-tensorizer loads every vector (plain and encrypted) from the
system library and gets the manifest's bytes; then the file the tz-torch
example wrote, if given."""
import hashlib
import importlib.metadata
import json
import os
import sys

import torch

import tensorizer
from tensorizer import DecryptionParams, TensorDeserializer
from tensorizer import _native

VECTORS = "/vectors"
manifest = json.load(open(os.path.join(VECTORS, "manifest.json")))

assert tensorizer.__file__.startswith("/usr/lib/python3/dist-packages/tensorizer/"), tensorizer.__file__
dist = importlib.metadata.distribution("tensorizer-native")
print(f"tensorizer {tensorizer.__version__} (distribution {dist.metadata['Name']} {dist.version}),"
      f" torch {torch.__version__}, python {sys.version.split()[0]}")
_native.lib  # loads it
print(f"libtensorizer {tensorizer.__native_version__} from {_native.library_path()}")
assert not os.path.exists(os.path.join(os.path.dirname(tensorizer.__file__), "libtensorizer.so.0"))
assert os.path.realpath(_native.library_path()).startswith(("/usr/lib/", "/lib/")), _native.library_path()


def raw(t):
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes()


def flat(mapping, prefix=()):
    for k in mapping.keys():
        v = mapping[k]
        if isinstance(v, torch.Tensor):
            yield ".".join(str(c) for c in prefix + (k,)), v
        else:
            yield from flat(v, prefix + (k,))


for name in sorted(k for k in manifest if not k.startswith("_")):
    spec = manifest[name]
    kwargs = {}
    if "key_hex" in spec:
        kwargs["encryption"] = DecryptionParams.from_key(bytes.fromhex(spec["key_hex"]))
    elif "password" in spec:
        kwargs["encryption"] = DecryptionParams.from_string(spec["password"])
    d = TensorDeserializer(os.path.join(VECTORS, name + ".tensors"), device="cpu", verify_hash=True, **kwargs)
    try:
        loaded = dict(flat(d))
    finally:
        d.close()
    want = spec["tensors"]
    assert sorted(loaded) == sorted(want), (name, sorted(loaded), sorted(want))
    for tname, t in loaded.items():
        w = want[tname]
        assert str(t.dtype) == "torch." + w["dtype"], (name, tname, t.dtype)
        assert list(t.shape) == w["shape"], (name, tname)
        b = raw(t)
        if w["meta"]:
            assert b == bytes(len(b)), (name, tname)
        else:
            assert hashlib.sha256(b).hexdigest() == w["sha256"], (name, tname)
    print(f"  {name}: {len(loaded)} tensors match the manifest"
          + (" (encrypted)" if kwargs else ""))

for path in sys.argv[1:]:
    d = TensorDeserializer(path, device="cpu", verify_hash=True)
    try:
        names = sorted(n for n, _ in flat(d))
    finally:
        d.close()
    print(f"  {path} (written by the tz-torch example): {len(names)} tensors: {', '.join(names)}")
print("python3-tensorizer: OK")
