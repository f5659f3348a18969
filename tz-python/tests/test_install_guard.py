"""tensorizer._install: refusing to share the tensorizer folder with upstream's
distribution, whose files pip would silently mix with ours."""

import sys

import pytest

from tensorizer import _install


def _site(tmp_path, name, with_upstream):
    site = tmp_path / name
    (site / "tensorizer").mkdir(parents=True)
    (site / "tensorizer" / "__init__.py").write_text("")
    if with_upstream:
        info = site / "tensorizer-2.10.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorizer\nVersion: 2.10.1\n")
        (info / "RECORD").write_text(
            "tensorizer/__init__.py,,\ntensorizer-2.10.1.dist-info/METADATA,,\n"
        )
    return site


@pytest.fixture
def on_path(monkeypatch):
    def add(site):
        monkeypatch.syspath_prepend(str(site))

    return add


def test_upstream_in_the_same_folder_is_refused(tmp_path, on_path, monkeypatch):
    monkeypatch.delenv("TENSORIZER_ALLOW_UPSTREAM_DIST", raising=False)
    site = _site(tmp_path, "site", with_upstream=True)
    on_path(site)
    with pytest.raises(_install.ConflictingInstallError) as e:
        _install.check_no_upstream(str(site / "tensorizer"))
    assert "tensorizer==2.10.1" in str(e.value)
    assert "pip uninstall -y tensorizer tensorizer-native" in str(e.value)
    assert isinstance(e.value, ImportError)
    monkeypatch.setenv("TENSORIZER_ALLOW_UPSTREAM_DIST", "1")
    _install.check_no_upstream(str(site / "tensorizer"))


def test_upstream_elsewhere_is_not_our_concern(tmp_path, on_path):
    other = _site(tmp_path, "other", with_upstream=True)
    ours = _site(tmp_path, "ours", with_upstream=False)
    on_path(other)
    _install.check_no_upstream(str(ours / "tensorizer"))


def test_this_checkout_imports_without_a_conflict():
    import tensorizer

    assert _install._upstream_in(tensorizer.__path__[0]) is None
    assert "tensorizer" in sys.modules


def test_the_command_refuses_a_package_upstream_overwrote():
    import types

    overwritten = types.ModuleType("tensorizer")
    overwritten.__file__ = "/site/tensorizer/__init__.py"
    with pytest.raises(_install.ConflictingInstallError, match="installed over it"):
        _install.check_package_is_ours(overwritten)
    import tensorizer

    _install.check_package_is_ours(tensorizer)
