#!/usr/bin/env bash
# Compares a built libtensorizer.so.0 with the committed ABI baseline, using
# libabigail (Debian's abigail-tools).
#
#   check-abi.sh BUILD_DIR          fail on any change but added functions
#   check-abi.sh BUILD_DIR --update rewrite the baseline from BUILD_DIR
#
# Only what <tensorizer.h> declares counts: exported tz_* functions and the
# types they reach. Added functions (and the new types only they use) pass;
# a removed or changed function, or a changed public struct, fails. A struct
# that grows on purpose (a new TZ_*_VERSION) is an ABI change too: rerun with
# --update and commit the new baseline with it, so the change is reviewed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "$1" && pwd)"
lib="$build/tz-capi/libtensorizer.so.0"
baseline="$here/libtensorizer.so.0.abi"
headers=(--headers-dir "$here/../include" --headers-dir "$build/tz-capi/include")
# DWARF of the exported interfaces only, locations as bare file names (they
# tell public from private types), no build paths: the same on any machine.
common=(--drop-private-types --exported-interfaces-only)

if [ "${2:-}" = "--update" ]; then
  abidw "${headers[@]}" "${common[@]}" --no-corpus-path --no-comp-dir-path \
    --drop-undefined-syms --short-locs "$lib" > "$baseline.tmp"
  mv "$baseline.tmp" "$baseline"
  echo "ABI baseline written: $baseline"
  exit 0
fi

set +e
report="$(abidiff "${common[@]}" --no-added-syms \
  --headers-dir2 "$here/../include" --headers-dir2 "$build/tz-capi/include" \
  "$baseline" "$lib" 2>&1)"
rc=$?
set -e
# abidiff's status is a bit field: 1 tool error, 2 usage error, 4 ABI change,
# 8 incompatible ABI change. With added symbols left out, any bit fails.
if [ "$rc" -ne 0 ]; then
  echo "$report"
  echo "ABI check FAILED (abidiff status $rc): libtensorizer.so.0 differs from $baseline" >&2
  echo "Only additions are allowed; see tz-capi/abi/check-abi.sh for an intended change." >&2
  exit 1
fi
echo "ABI check passed: libtensorizer.so.0 matches $baseline (additions allowed)"
