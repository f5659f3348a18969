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
# Writing with the distro torch too: a module and a bfloat16 tensor, plain and
# encrypted, read back verified.
from tensorizer import EncryptionParams, TensorSerializer  # noqa: E402

torch.manual_seed(0)
module = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 4))
module(torch.randn(5, 16))
state = {k: v.detach().clone() for k, v in module.state_dict().items()}
state["extra.bf16"] = torch.linspace(-2, 2, 9).to(torch.bfloat16)
for encrypted in (False, True):
    path = f"/tmp/py-roundtrip{'-enc' if encrypted else ''}.tensors"
    enc = EncryptionParams.random() if encrypted else None
    s = TensorSerializer(path, encryption=enc)
    s.write_state_dict(state)
    s.close()
    dec = DecryptionParams.from_key(enc.key) if encrypted else None
    d = TensorDeserializer(path, device="cpu", verify_hash=True, encryption=dec)
    try:
        back = dict(flat(d))
    finally:
        d.close()
    assert sorted(back) == sorted(state), sorted(back)
    for k, v in state.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    mpath = path.replace(".tensors", "-module.tensors")
    s = TensorSerializer(mpath, encryption=enc)
    s.write_module(module)
    s.close()
    fresh = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 4))
    d = TensorDeserializer(mpath, device="cpu", verify_hash=True, encryption=dec)
    try:
        d.load_into_module(fresh)
    finally:
        d.close()
    # Under no_grad: load_into_module registers buffers as upstream does (as
    # Parameters, floating ones requiring grad), which batch_norm refuses in
    # grad mode, with torch 2.x as with 1.13.
    x = torch.randn(3, 16)
    with torch.no_grad():
        assert torch.equal(module.eval()(x), fresh.eval()(x))
    print(f"  wrote and reloaded {path} ({len(back)} tensors) and {mpath} (module):"
          f" identical{' (encrypted)' if encrypted else ''}")
print("python3-tensorizer: OK")
