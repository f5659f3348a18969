#!/usr/bin/env bash
# Installs everything `make demo` / `make test` need on a fresh Debian bookworm machine:
# Debian -dev packages for the C++ build, and a .venv/ with our Python dependencies.
# Idempotent: each step is skipped when its result is already present.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES="build-essential cmake pkg-config catch2 libsodium-dev"
need_apt=()
for p in $APT_PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch first and pinned exactly: anything that depends on torch must find it installed.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q torch==2.13.0
fi
.venv/bin/pip install -q "numpy" "cffi>=1.15" "pytest" "psutil"
