import os
import sys

# Make the package importable without installing it (pip install -e also works).
_here = os.path.dirname(os.path.abspath(__file__))
_pkg_root = os.path.dirname(_here)
if _pkg_root not in sys.path:
    sys.path.insert(0, _pkg_root)

