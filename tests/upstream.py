"""Run code under upstream tensorizer 2.12.1 (the reference implementation).

Upstream lives in its own virtual environment, ``<repo>/.venv-upstream``
(created by ``scripts/setup-upstream.sh``), so that it never shadows our
``tensorizer``; ``TZ_UPSTREAM_PYTHON`` overrides the interpreter.  Code is run there in a subprocess whose ``sys.path`` starts
with this ``tests/`` folder, so it can ``import crosscases`` / ``import craft``.

If that venv is missing, tests that need it are skipped -- unless the
environment variable ``TZ_REQUIRE_UPSTREAM`` is set (CI does), in which case
they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Optional, Sequence

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
UPSTREAM_VENV = REPO_ROOT / ".venv-upstream"
# TZ_UPSTREAM_PYTHON may point at another interpreter that has upstream installed.
UPSTREAM_PYTHON = Path(os.environ.get("TZ_UPSTREAM_PYTHON") or UPSTREAM_VENV / "bin" / "python")
UPSTREAM_VERSION = "2.12.1"

__all__ = [
    "TESTS_DIR",
    "REPO_ROOT",
    "UPSTREAM_PYTHON",
    "UPSTREAM_VERSION",
    "UpstreamError",
    "upstream_available",
    "upstream_required",
    "require_upstream",
    "run_upstream",
    "run_upstream_json",
]


class UpstreamError(RuntimeError):
    """The upstream subprocess exited with a non-zero status."""

    def __init__(self, message: str, result: subprocess.CompletedProcess):
        super().__init__(message)
        self.result = result


def upstream_available() -> bool:
    return UPSTREAM_PYTHON.is_file() and os.access(UPSTREAM_PYTHON, os.X_OK)


def upstream_required() -> bool:
    return os.environ.get("TZ_REQUIRE_UPSTREAM", "").strip() not in ("", "0", "false", "no")


def require_upstream() -> None:
    """Skip the calling test if upstream is missing (fail if it is required)."""
    if upstream_available():
        return
    import pytest

    msg = (
        f"upstream tensorizer interpreter not found at {UPSTREAM_PYTHON}"
        " (run scripts/setup-upstream.sh)"
    )
    if upstream_required():
        pytest.fail(msg + "; TZ_REQUIRE_UPSTREAM is set", pytrace=False)
    pytest.skip(msg)


_PRELUDE = f"""\
import sys as _sys, warnings as _warnings
_warnings.filterwarnings("ignore")
import tensorizer as _tz
if _tz.__version__ != {UPSTREAM_VERSION!r}:
    raise SystemExit("expected upstream tensorizer {UPSTREAM_VERSION}, got "
                     + _tz.__version__ + " from " + _tz.__file__)
del _tz
"""


def run_upstream(
    code: str,
    *,
    args: Sequence[str] = (),
    cwd: Optional[os.PathLike] = None,
    timeout: float = 600,
    check: bool = True,
    env: Optional[dict] = None,
) -> subprocess.CompletedProcess:
    """Run ``code`` with upstream's interpreter; returns the CompletedProcess.

    ``args`` become ``sys.argv[1:]``.  With ``check`` (default), a non-zero exit
    raises :class:`UpstreamError` carrying stdout and stderr.
    """
    require_upstream()
    full_env = dict(os.environ)
    # never let an outer venv or our package leak into the upstream process
    for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        full_env.pop(var, None)
    full_env["PYTHONPATH"] = str(TESTS_DIR)
    full_env["PYTHONDONTWRITEBYTECODE"] = "1"
    full_env.setdefault("CUDA_VISIBLE_DEVICES", "")
    if env:
        full_env.update(env)
    result = subprocess.run(
        [str(UPSTREAM_PYTHON), "-c", _PRELUDE + textwrap.dedent(code), *map(str, args)],
        cwd=str(cwd) if cwd is not None else str(TESTS_DIR),
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise UpstreamError(
            f"upstream subprocess failed with exit status {result.returncode}\n"
            f"--- stdout ---\n{result.stdout[-5000:]}\n"
            f"--- stderr ---\n{result.stderr[-10000:]}",
            result,
        )
    return result


def run_upstream_json(code: str, **kwargs) -> Any:
    """Like :func:`run_upstream`; parses the last non-empty stdout line as JSON."""
    result = run_upstream(code, **kwargs)
    lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
    if not lines:
        raise UpstreamError(
            f"upstream subprocess printed nothing\n--- stderr ---\n{result.stderr[-10000:]}",
            result,
        )
    return json.loads(lines[-1])


if __name__ == "__main__":  # pragma: no cover - manual check
    print(run_upstream_json("import tensorizer, json; print(json.dumps(tensorizer.__version__))"))
    sys.exit(0)
