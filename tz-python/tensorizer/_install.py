"""
Guards against two distributions sharing the ``tensorizer`` folder.

This package is distributed as ``tensorizer-native`` but imports as
``tensorizer``, like upstream's ``tensorizer`` distribution (which, for
example, ``vllm[tensorizer]`` pins). pip does not know the two overlap: it
installs either over the other without a word, and uninstalling one later
deletes files of the other. Both cases are refused loudly instead.
"""

import os
from importlib import metadata

DISTRIBUTION = "tensorizer-native"
UPSTREAM_DISTRIBUTION = "tensorizer"
_ALLOW_ENV = "TENSORIZER_ALLOW_UPSTREAM_DIST"


class ConflictingInstallError(ImportError):
    """Upstream's ``tensorizer`` distribution is installed in the same folder."""


def _upstream_in(package_dir: str):
    """Upstream's distribution, if its files are in `package_dir`'s folder."""
    try:
        dist = metadata.distribution(UPSTREAM_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    site = os.path.realpath(os.path.dirname(package_dir))
    for f in dist.files or ():
        if f.parts[:1] == ("tensorizer",) and f.name == "__init__.py":
            if os.path.realpath(os.path.dirname(os.path.dirname(dist.locate_file(f)))) == site:
                return dist
    return None


def fix_command() -> str:
    return (
        f"pip uninstall -y {UPSTREAM_DISTRIBUTION} {DISTRIBUTION}"
        f" && pip install {DISTRIBUTION}"
    )


def check_no_upstream(package_dir: str) -> None:
    """Raise ConflictingInstallError when upstream shares our folder."""
    if os.environ.get(_ALLOW_ENV) == "1":
        return
    dist = _upstream_in(package_dir)
    if dist is None:
        return
    raise ConflictingInstallError(
        f"{DISTRIBUTION} and upstream {UPSTREAM_DISTRIBUTION}=={dist.version}"
        f" are both installed into {os.path.dirname(package_dir)}: they share the"
        " `tensorizer` folder, so whichever was installed last replaced the"
        " other's files, and uninstalling either deletes files of the other."
        f" Keep one: {fix_command()}"
        f" (or set {_ALLOW_ENV}=1 to import anyway)."
    )


def check_package_is_ours(package) -> None:
    """For entry points this distribution installs (``tensorizer`` command):
    refuse to run on a ``tensorizer`` package that upstream's distribution
    overwrote, which still has this module but not our ``__init__``."""
    if getattr(package, "__distribution__", None) != DISTRIBUTION:
        raise ConflictingInstallError(
            f"the tensorizer package in {os.path.dirname(package.__file__)} is not"
            f" {DISTRIBUTION}'s: upstream {UPSTREAM_DISTRIBUTION} was installed over it."
            f" Keep one: {fix_command()}"
        )
