"""pytest configuration for the tensorizer compatibility suite.

Environment variables:

* ``TZ_TEST_IMPL`` -- ``ours`` (default) tests our ``tensorizer``;
  ``upstream`` runs the same suite with upstream tensorizer as the
  implementation under test (``.venv-upstream/bin/python -m pytest tests``),
  to validate the tests themselves.  Tests of deliberate differences from
  upstream carry ``@pytest.mark.ours_only`` and are skipped then.
* ``TZ_RUN_OURS_ONLY=1`` -- debugging aid: do not skip ``ours_only`` tests
  under ``TZ_TEST_IMPL=upstream`` (they are then expected to fail, each for
  the documented reason).
* ``TZ_REQUIRE_UPSTREAM`` -- when set, a missing ``.venv-upstream`` makes the
  cross tests fail instead of skip (CI sets it).

Settings that would otherwise live in a pytest.ini are made here, in
``pytest_configure``, so the repository root needs no pytest config file.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

import upstream as _upstream  # noqa: E402
from tz_impl import IMPL  # noqa: E402


def pytest_configure(config):
    for line in (
        "ours_only: behaviour where our tensorizer deliberately differs from (goes"
        " beyond) upstream; skipped when TZ_TEST_IMPL=upstream",
        "upstream: needs upstream tensorizer in .venv-upstream (skipped when it is"
        " missing, unless TZ_REQUIRE_UPSTREAM is set); added automatically to tests"
        " that use the `upstream` fixture",
    ):
        config.addinivalue_line("markers", line)
    for line in (
        "ignore:ComplexHalf support is experimental:UserWarning",
        "ignore:The given NumPy array is not writable:UserWarning",
        "ignore:.*TypedStorage is deprecated:UserWarning",
    ):
        config.addinivalue_line("filterwarnings", line)
    _check_implementation()


def _check_implementation():
    """Make sure ``import tensorizer`` gives the implementation asked for."""
    try:
        import tensorizer
    except ImportError:
        return  # reported by the test modules themselves
    where = Path(getattr(tensorizer, "__file__", "") or ".").resolve()
    from_upstream_venv = _upstream.UPSTREAM_VENV.resolve() in where.parents
    if IMPL == "upstream" and not from_upstream_venv:
        raise pytest.UsageError(
            f"TZ_TEST_IMPL=upstream, but tensorizer was imported from {where};"
            " run with .venv-upstream/bin/python"
        )
    if IMPL == "ours" and from_upstream_venv:
        raise pytest.UsageError(
            f"tensorizer was imported from upstream's venv ({where});"
            " set TZ_TEST_IMPL=upstream or run with .venv/bin/python"
        )


def pytest_report_header(config):
    try:
        import tensorizer

        where = f"{tensorizer.__file__} (version {getattr(tensorizer, '__version__', '?')})"
    except Exception as e:  # noqa: BLE001
        where = f"not importable: {e!r}"
    return [
        f"TZ_TEST_IMPL={IMPL}; tensorizer: {where}",
        f"upstream venv: {'present' if _upstream.upstream_available() else 'missing'}"
        f"{' (required)' if _upstream.upstream_required() else ''}",
    ]


def pytest_collection_modifyitems(config, items):
    run_ours_only = os.environ.get("TZ_RUN_OURS_ONLY", "") not in ("", "0")
    skip_ours = pytest.mark.skip(reason="ours_only: deliberate difference from upstream (TZ_TEST_IMPL=upstream)")
    missing = not _upstream.upstream_available()
    required = _upstream.upstream_required()
    skip_up = pytest.mark.skip(reason="upstream venv .venv-upstream missing (set TZ_REQUIRE_UPSTREAM=1 to fail instead)")
    for item in items:
        if TESTS_DIR not in Path(str(item.fspath)).resolve().parents:
            continue  # only this suite's tests
        if "upstream" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.upstream)
        if IMPL == "upstream" and item.get_closest_marker("ours_only") and not run_ours_only:
            item.add_marker(skip_ours)
        if missing and not required and item.get_closest_marker("upstream"):
            item.add_marker(skip_up)


# ---------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="session")
def impl() -> str:
    """``"ours"`` or ``"upstream"``: which implementation is under test."""
    return IMPL


@pytest.fixture(scope="session")
def upstream():
    """The :mod:`upstream` helper module; skips/fails if the venv is missing."""
    _upstream.require_upstream()
    return _upstream


@pytest.fixture
def tz():
    import tensorizer

    return tensorizer
