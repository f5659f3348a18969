"""How the package finds libtensorizer: bundled next to it, else the system's
libtensorizer.so.0 through the dynamic linker's path, unless
TENSORIZER_LIBRARY names one; a library of another major version is refused."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tensorizer import _native

PACKAGE = Path(_native.__file__).resolve().parent

PROBE = (
    "import sys; sys.path.insert(0, sys.argv[1]);"
    "from tensorizer import _native; print(_native.library_path());"
    "print(_native.native_version())"
)


def _unbundled_copy(tmp_path) -> Path:
    """The package without its bundled library, as a distro ships it."""
    dst = tmp_path / "site" / "tensorizer"
    shutil.copytree(PACKAGE, dst, ignore=shutil.ignore_patterns("libtensorizer.so*", "__pycache__"))
    return dst.parent


def _probe(site: Path, **env):
    clean = {k: v for k, v in os.environ.items() if k not in ("TENSORIZER_LIBRARY", "LD_LIBRARY_PATH")}
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(site)],
        env={**clean, **env}, capture_output=True, text=True, timeout=60, cwd=site,
    )


def test_without_a_bundled_copy_the_linker_path_is_searched(tmp_path):
    site = _unbundled_copy(tmp_path)
    libdir = tmp_path / "lib"
    libdir.mkdir()
    shutil.copy2(_native.library_path(), libdir / "libtensorizer.so.0")
    r = _probe(site, LD_LIBRARY_PATH=str(libdir))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == str(libdir / "libtensorizer.so.0")
    r = _probe(site)
    assert r.returncode != 0
    assert "could not load the native library libtensorizer.so.0" in r.stderr


def test_the_environment_variable_wins_over_a_bundled_copy(tmp_path):
    copy = tmp_path / "elsewhere.so"
    shutil.copy2(_native.library_path(), copy)
    r = _probe(PACKAGE.parent, TENSORIZER_LIBRARY=str(copy))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == str(copy)


def test_a_library_of_another_major_version_is_refused(tmp_path):
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("a C compiler is needed (scripts/setup.sh installs build-essential)")
    src = tmp_path / "fake.c"
    src.write_text('const char *tz_version(void) { return "99.0.0"; }\n')
    fake = tmp_path / "libfake.so"
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(fake)], check=True)
    r = _probe(PACKAGE.parent, TENSORIZER_LIBRARY=str(fake))
    assert r.returncode != 0
    assert "version 99.0.0, but this package was built for" in r.stderr
