"""tz-torch (the C++ API for libtorch users) against the Python package and
upstream: files written by either side load on the other with identical
tensors, and tz-torch writes the same bytes as write_module/write_state_dict.
Also the C++ example, built against an installed tree.

The C++ side is tz-torch's Catch2 binary (hidden ``[cross]`` case) from the
build directory (``build/``, or ``TZ_BUILD_DIR``). It is skipped only where
the build disabled tz-torch (``-DTZ_WITH_TORCH=OFF``); otherwise a missing
binary fails, since `make build` builds it against the torch in .venv.
"""
import os
import subprocess
from pathlib import Path

import pytest
import torch

import tz_torch_cross

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("TZ_BUILD_DIR") or ROOT / "build")


def run(*cmd, env=None, cwd=None):
    result = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-5000:]}\n{result.stderr[-5000:]}"
    return result.stdout


def _require_tz_torch():
    exe = BUILD / "tz-torch" / "tz_torch_tests"
    if exe.exists():
        return exe
    cache = BUILD / "CMakeCache.txt"
    if cache.exists() and "TZ_WITH_TORCH:STRING=OFF" in cache.read_text():
        pytest.skip(f"tz-torch is disabled in {BUILD} (TZ_WITH_TORCH=OFF)")
    pytest.fail(f"{exe} is missing: run `make build` (it builds tz-torch against the torch in .venv)")


@pytest.fixture(scope="module")
def tz_torch_tests():
    return _require_tz_torch()


@pytest.mark.parametrize("python_side", ["package", "upstream"])
def test_cross(python_side, tz_torch_tests, tmp_path, request):
    if python_side == "package":
        tz_torch_cross.write(tmp_path)
    else:
        up = request.getfixturevalue("upstream")  # skips, or fails under TZ_REQUIRE_UPSTREAM
        up.run_upstream("import sys, tz_torch_cross; tz_torch_cross.write(sys.argv[1])", args=[tmp_path])

    # C++ checks py_* (load_into_module, load_state_dict, records, decryption), writes cpp_*.
    env = dict(os.environ, TZ_TORCH_CROSS_DIR=str(tmp_path))
    result = subprocess.run([str(tz_torch_tests), "[cross]"], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-10000:] + result.stderr[-5000:]
    assert "1 test case" in result.stdout

    # Same input, same bytes: module indices, types, names, dtype strings, hashes.
    for what in ("module", "dtypes", "nested"):
        assert (tmp_path / f"cpp_{what}.tensors").read_bytes() == (
            tmp_path / f"py_{what}.tensors"
        ).read_bytes(), what

    if python_side == "package":
        checked = tz_torch_cross.check(tmp_path)
    else:
        checked = up.run_upstream_json(
            "import json, sys, tz_torch_cross; print(json.dumps(tz_torch_cross.check(sys.argv[1])))",
            args=[tmp_path],
        )
    # state_dict() lists the shared submodule's tensor twice: 11 module entries.
    assert checked == 11 + 2 * len(tz_torch_cross.DTYPES) + 6


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    _require_tz_torch()
    p = tmp_path_factory.mktemp("prefix")
    run("cmake", "--install", str(BUILD), "--prefix", str(p))
    return p


def test_install_layout(prefix):
    for rel in ["include/tensorizer/torch.hpp", "lib/libtensorizer_torch.so.0",
                "lib/cmake/tensorizer_torch/tensorizer_torchConfig.cmake",
                "lib/cmake/tensorizer_torch/tensorizer_torchConfigVersion.cmake",
                "lib/cmake/tensorizer_torch/tensorizer_torchTargets.cmake"]:
        assert (prefix / rel).exists(), rel


def test_c_symbols_stay_in_libtensorizer(prefix):
    out = run("nm", "-D", "--defined-only", str(prefix / "lib" / "libtensorizer_torch.so.0"))
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert any("tensorizer5torch" in n for n in names)  # the C++ API is exported
    assert [n for n in names if n.startswith("tz_")] == []


def test_cpp_example_with_cmake_package(prefix, tmp_path):
    out_dir = tmp_path / "example"
    run("cmake", "-S", str(ROOT / "examples" / "cpp"), "-B", str(out_dir), "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_PREFIX_PATH={prefix};{torch.utils.cmake_prefix_path}")
    run("cmake", "--build", str(out_dir))
    saved = tmp_path / "net.tensors"
    out = run(str(out_dir / "save_reload_module"), str(saved))
    assert "saved and reloaded 10 tensors" in out and "identical" in out

    # And the Python package reads what the example wrote, with write_module's names.
    from tensorizer import TensorDeserializer

    with TensorDeserializer(str(saved), device="cpu", verify_hash=True) as t:
        assert list(t.keys()) == [
            ".scale", "fc1.weight", "fc1.bias", "norm.weight", "norm.bias", "norm.running_mean",
            "norm.running_var", "norm.num_batches_tracked", "fc2.weight", "fc2.bias",
        ]
        assert t[".scale"].dtype is torch.bfloat16
