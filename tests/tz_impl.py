"""Which tensorizer implementation the suite is testing (``TZ_TEST_IMPL``).

Kept in its own module (not conftest) so test modules can import it even when
pytest also collects another directory with its own ``conftest.py``.
"""

import os

IMPL = os.environ.get("TZ_TEST_IMPL", "ours").strip().lower() or "ours"
if IMPL not in ("ours", "upstream"):
    raise RuntimeError(f"TZ_TEST_IMPL must be 'ours' or 'upstream', not {IMPL!r}")
UPSTREAM = IMPL == "upstream"
