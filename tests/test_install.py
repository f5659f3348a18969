"""The installed C library: layout, exported symbols, pkg-config and CMake
consumers compiling the C example, and the header as strict C99."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
VECTORS = ROOT / "tests" / "vectors"


def run(*cmd, env=None, cwd=None):
    result = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    if not (BUILD / "CMakeCache.txt").exists():
        pytest.fail("build/ is missing: run `make build` first")
    p = tmp_path_factory.mktemp("prefix")
    run("cmake", "--install", str(BUILD), "--prefix", str(p))
    return p


def test_install_layout(prefix):
    for rel in ["include/tensorizer.h", "include/tensorizer_version.h", "lib/libtensorizer.so.0", "lib/pkgconfig/tensorizer.pc",
                "lib/cmake/tensorizer/tensorizerConfig.cmake",
                "lib/cmake/tensorizer/tensorizerConfigVersion.cmake"]:
        assert (prefix / rel).exists(), rel


def test_one_version_source(prefix):
    """The CMake project version reaches the header, tz_version(), the .pc
    file, the CMake package and (tests/packaging) the wheel."""
    import re

    version = re.search(r"project\(tensorizer VERSION ([0-9.]+)",
                        (ROOT / "CMakeLists.txt").read_text()).group(1)
    major, minor, patch = version.split(".")
    header = (prefix / "include" / "tensorizer_version.h").read_text()
    assert f"#define TZ_VERSION_MAJOR {major}\n" in header
    assert f"#define TZ_VERSION_MINOR {minor}\n" in header
    assert f"#define TZ_VERSION_PATCH {patch}\n" in header
    assert f"Version: {version}\n" in (prefix / "lib" / "pkgconfig" / "tensorizer.pc").read_text()
    config = (prefix / "lib" / "cmake" / "tensorizer" / "tensorizerConfigVersion.cmake").read_text()
    assert f'set(PACKAGE_VERSION "{version}")' in config
    from tensorizer import _native

    assert _native.native_version() == version
    assert _native.lib.TZ_VERSION_MAJOR == int(major)


def test_only_tz_symbols_are_exported(prefix):
    out = run("nm", "-D", "--defined-only", str(prefix / "lib" / "libtensorizer.so.0"))
    # Newer binutils print "tz_x@@TENSORIZER_0", and the version node itself
    # (tensorizer.map) as an absolute symbol "TENSORIZER_0".
    names = [line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()]
    names = [n for n in names if n != "TENSORIZER_0"]
    assert names, "no exported symbols found"
    assert [n for n in names if not n.startswith("tz_")] == []
    for required in ["tz_version", "tz_error_last", "tz_reader_open", "tz_reader_read_batch",
                     "tz_writer_open", "tz_writer_write", "tz_writer_close"]:
        assert required in names


def test_header_is_strict_c99(tmp_path):
    src = tmp_path / "h.c"
    src.write_text("#include <tensorizer.h>\nint main(void) { return TZ_OK; }\n")
    run("cc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic",
        f"-I{ROOT / 'tz-capi' / 'include'}", f"-I{BUILD / 'tz-capi' / 'include'}",
        "-c", str(src), "-o", str(tmp_path / "h.o"))


def test_c_example_with_pkg_config(prefix, tmp_path):
    if shutil.which("pkg-config") is None:
        pytest.fail("pkg-config is not installed (scripts/setup.sh installs it)")
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    flags = run("pkg-config", "--cflags", "--libs", "tensorizer", env=env).split()
    exe = tmp_path / "tzinspect"
    run("cc", "-std=c99", "-Wall", "-Werror", str(ROOT / "examples" / "c" / "tzinspect.c"), *flags,
        f"-Wl,-rpath,{prefix / 'lib'}", "-o", str(exe))
    out = run(str(exe), str(VECTORS / "structured.tensors"), "--verify")
    assert "4 tensors" in out and "hashes verified" in out
    assert "enc/layers/1/b" in out


def test_c_example_with_cmake_package(prefix, tmp_path):
    out_dir = tmp_path / "consumer"
    run("cmake", "-S", str(ROOT / "examples" / "cmake-consumer"), "-B", str(out_dir),
        f"-DCMAKE_PREFIX_PATH={prefix}", f"-DCMAKE_BUILD_RPATH={prefix / 'lib'}")
    run("cmake", "--build", str(out_dir))
    out = run(str(out_dir / "tzinspect"), str(VECTORS / "v4_meta.tensors"), "--verify")
    assert "meta" in out and "hashes verified" in out


def test_c_example_reports_errors(prefix, tmp_path):
    bad = tmp_path / "bad.tensors"
    bad.write_bytes(b"|TZR|" + b"\x00" * 10)
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    flags = run("pkg-config", "--cflags", "--libs", "tensorizer", env=env).split()
    exe = tmp_path / "tzinspect"
    run("cc", str(ROOT / "examples" / "c" / "tzinspect.c"), *flags, f"-Wl,-rpath,{prefix / 'lib'}",
        "-o", str(exe))
    result = subprocess.run([str(exe), str(bad)], capture_output=True, text=True)
    assert result.returncode == 1
    assert "TZ_E_VERSION" in result.stderr
