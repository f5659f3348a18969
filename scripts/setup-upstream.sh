#!/usr/bin/env bash
# Creates .venv-upstream/ holding upstream tensorizer 2.12.1, the live reference the
# cross-compatibility tests and benchmarks compare against. It is a separate venv so
# that upstream's `tensorizer` never shadows ours in .venv/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv-upstream/bin/python ]; then
  "$PY" -m venv .venv-upstream
fi
if ! .venv-upstream/bin/python -c "import torch" 2>/dev/null; then
  # Pinned exactly, and first: an unpinned torch requirement would pull CUDA builds.
  .venv-upstream/bin/pip install -q torch==2.13.0
fi
if ! .venv-upstream/bin/python -c "import tensorizer, sys; sys.exit(tensorizer.__version__ != '2.12.1')" 2>/dev/null; then
  .venv-upstream/bin/pip install -q tensorizer==2.12.1
fi
