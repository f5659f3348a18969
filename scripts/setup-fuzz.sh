#!/usr/bin/env bash
# Installs clang and its libFuzzer/sanitizer runtimes (Debian bookworm) for
# `make fuzz-build`. Idempotent.
set -euo pipefail
APT_PACKAGES="clang-14 libclang-rt-14-dev"
need=()
for p in $APT_PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
