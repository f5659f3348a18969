#!/usr/bin/env bash
# Runs fuzz targets built by `make fuzz-build` (build-fuzz/), one at a time:
# first over their regression inputs and seeds (each must pass), then
# fuzzing for SECONDS each from a working corpus in build-fuzz/corpus/.
# A crash stops with the input saved under build-fuzz/artifacts/<target>/;
# fix it, then add that file to fuzz/regressions/<target>/.
#   fuzz/run.sh SECONDS TARGET...
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=$1
shift
status=0
for t in "$@"; do
  exe=build-fuzz/fuzz/fuzz_$t
  work=build-fuzz/corpus/$t
  art=build-fuzz/artifacts/$t
  mkdir -p "$work" "$art" fuzz/regressions/$t
  echo "== fuzz_$t: replaying regressions and seeds"
  "$exe" -runs=0 fuzz/regressions/$t fuzz/corpus/$t 2>&1 | tail -n 2
  echo "== fuzz_$t: fuzzing for ${seconds}s"
  # One process in the foreground (no -jobs: the machine is shared); a slow input (10 s) or
  # more than 2 GiB of memory is a finding too.
  if ! "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -dict=fuzz/tz.dict -print_final_stats=1 -artifact_prefix="$art/" \
      "$work" fuzz/corpus/$t > "build-fuzz/fuzz_$t.log" 2>&1; then
    echo "fuzz_$t FAILED; input(s) in $art/, log in build-fuzz/fuzz_$t.log:"
    grep -E "ERROR|FUZZ BUG|SUMMARY|Test unit written" "build-fuzz/fuzz_$t.log" | head -n 10 || true
    status=1
  fi
  grep -E "^stat::number_of_executed_units|^stat::average_exec_per_sec|^#[0-9]+ +DONE" \
    "build-fuzz/fuzz_$t.log" | tr '\n' ' '
  echo
done
exit $status
