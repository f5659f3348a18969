"""Run inside the throwaway venv by test_wheel.py, as a user of the installed
wheel would: no checkout on sys.path, no compilers on PATH.

argv: served_dir http_base https_base
"""

import os
import shutil
import subprocess
import sys

import torch

import tensorizer
from tensorizer import (
    DecryptionParams,
    EncryptionParams,
    TensorDeserializer,
    TensorSerializer,
    _native,
)

served, http_base, https_base = sys.argv[1:4]
venv = sys.prefix


def check(cond, what):
    if not cond:
        sys.exit(f"FAILED: {what}")


# The package and its library come from the venv, the library's dependencies
# from the wheel's vendored copies, never from the system.
check(tensorizer.__file__.startswith(venv), f"tensorizer imported from {tensorizer.__file__}")
check(_native.library_path().startswith(venv), f"library from {_native.library_path()}")
for tool in ("cc", "gcc", "g++", "c++", "clang", "ld"):
    check(shutil.which(tool) is None, f"{tool} on PATH")
with open("/proc/self/maps") as maps:
    mapped = {line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6}
for dep in ("libsodium", "libcurl", "libhiredis"):
    paths = [p for p in mapped if os.path.basename(p).startswith(dep)]
    check(paths, f"{dep} not loaded")
    check(all("tensorizer_native.libs" in p for p in paths), f"{dep} loaded from {paths}")

# The distribution's version is the library's (one source: CMake).
from importlib import metadata

check(metadata.version("tensorizer-native") == _native.native_version(), "wheel version")
check(tensorizer.__version__ == "2.12.1", "upstream API level")

# Encrypted round trip with hash verification.
torch.manual_seed(0)
state = {
    "w": torch.randn(64, 33),
    "b": torch.arange(17, dtype=torch.int64),
    "h": torch.randn(5, 7).to(torch.bfloat16),
}
path = os.path.join(served, "model.tensors")
enc = EncryptionParams.random()
ser = TensorSerializer(path, encryption=enc)
ser.write_state_dict(state)
ser.close()
with TensorDeserializer(
    path, encryption=DecryptionParams.from_key(enc.key), verify_hash=True
) as loaded:
    check(set(loaded) == set(state), f"keys {set(loaded)}")
    for k, v in state.items():
        check(torch.equal(loaded[k], v), f"tensor {k} differs")
try:
    TensorDeserializer(path, encryption=DecryptionParams.from_key(bytes(32)))
    check(False, "a wrong key loaded")
except tensorizer.CryptographyError:
    pass

# Plain file over HTTP and HTTPS (vendored libcurl and OpenSSL).
plain = os.path.join(served, "plain.tensors")
ser = TensorSerializer(plain)
ser.write_state_dict(state)
ser.close()
for url in (f"{http_base}/plain.tensors", f"{https_base}/plain.tensors"):
    with TensorDeserializer(url, verify_hash=True) as remote:
        for k, v in state.items():
            check(torch.equal(remote[k], v), f"{url}: tensor {k} differs")

# The console command the wheel installs.
exe = os.path.join(venv, "bin", "tensorizer")
out = subprocess.run([exe, "--version"], capture_output=True, text=True)
check(out.returncode == 0 and tensorizer.__version__ in out.stdout, f"--version: {out}")
out = subprocess.run([exe, "verify", plain], capture_output=True, text=True)
check(out.returncode == 0, f"verify: {out}")
print("wheel user: OK")
