"""The wheel in dist/ (``make wheel``) installs and works without the checkout.

It goes into a throwaway venv with nothing but ``torch==2.13.0`` and its own
dependencies, and is used there with no compiler on PATH and no repository
on sys.path (``python -I``, run from a temporary folder): an encrypted,
hash-verified round trip, loads over HTTP and HTTPS from nginx on loopback,
and the ``tensorizer`` command. ``auditwheel show`` must agree with the
wheel's manylinux tag.

``make test-wheel`` builds the wheel first and sets TZ_REQUIRE_WHEEL=1, which
turns a missing wheel into a failure instead of a skip.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servers import Nginx, make_ca

REPO = Path(__file__).resolve().parents[2]
DIST = REPO / "dist"


def _wheel() -> Path:
    wheels = sorted(DIST.glob("tensorizer_native-*-manylinux_*.whl"))
    if len(wheels) != 1:
        msg = f"expected one repaired wheel in {DIST}, found {[w.name for w in wheels]} (make wheel)"
        if os.environ.get("TZ_REQUIRE_WHEEL") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return wheels[0]


def test_auditwheel_agrees_with_the_manylinux_tag():
    wheel = _wheel()
    tag = re.search(r"-(manylinux_\d+_\d+_x86_64)\.whl$", wheel.name).group(1)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", str(wheel)],
        capture_output=True, text=True, env=env, check=True,
    ).stdout
    assert f'consistent with the following platform tag: "{tag}"' in " ".join(out.split())


def test_the_wheel_works_in_a_clean_venv(tmp_path):
    wheel = _wheel()
    venv = tmp_path / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "torch==2.13.0", str(wheel)],
        check=True, timeout=1200,
    )
    served = tmp_path / "www"
    served.mkdir()
    ca = make_ca(tmp_path / "ca")
    # Only the venv's own bin on PATH: no compiler, no system tools.
    env = {
        "PATH": str(venv / "bin"),
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "CURL_CA_BUNDLE": str(ca["ca"]),
    }
    with Nginx(served, tmp_path / "nginx", tls=ca) as web:
        r = subprocess.run(
            [str(py), "-I", str(Path(__file__).with_name("wheel_user.py")),
             str(served), web.url("").rstrip("/"), web.url("", tls=True).rstrip("/")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
        )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "wheel user: OK" in r.stdout
