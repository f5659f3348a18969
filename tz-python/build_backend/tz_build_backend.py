"""
PEP 517 backend of tensorizer-native: scikit-build-core, plus one step.

The native sources (the top-level CMakeLists.txt and the tz-* components)
live beside tz-python/, not inside it, and an sdist holds only what is inside
the project folder. build_sdist therefore copies them into ``native/`` for the
duration of the build; tz-python/CMakeLists.txt builds from ``native/`` when
it exists (an unpacked sdist) and from ``..`` otherwise (a checkout).
"""

import os
import shutil

from scikit_build_core import build as _skbuild
from scikit_build_core.build import *  # noqa: F401,F403  (the other PEP 517 hooks)

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STAGE = os.path.join(_HERE, "native")
# What the native build reads; tests, benches and tz-torch stay out.
_NATIVE_FILES = ["CMakeLists.txt", "LICENSE"]
_NATIVE_DIRS = ["tz-format", "tz-io", "tz-crypto", "tz-capi"]
_IGNORE = shutil.ignore_patterns("tests", "__pycache__", "*.pyc", "abi")


def _stage_native_sources() -> bool:
    root = os.path.dirname(_HERE)
    if not os.path.isfile(os.path.join(root, "tz-capi", "include", "tensorizer.h")):
        return False  # already an unpacked sdist: native/ is there
    shutil.rmtree(_STAGE, ignore_errors=True)
    os.makedirs(_STAGE)
    for name in _NATIVE_FILES:
        if os.path.exists(os.path.join(root, name)):
            shutil.copy2(os.path.join(root, name), _STAGE)
    for name in _NATIVE_DIRS:
        shutil.copytree(os.path.join(root, name), os.path.join(_STAGE, name), ignore=_IGNORE)
    return True


def build_sdist(sdist_directory, config_settings=None):
    staged = _stage_native_sources()
    try:
        return _skbuild.build_sdist(sdist_directory, config_settings)
    finally:
        if staged:
            shutil.rmtree(_STAGE, ignore_errors=True)
