#!/usr/bin/env bash
# Runs a ctest suite and judges it from ctest's exit status and its machine-readable results
# (JUnit XML and Testing/Temporary/LastTestsFailed.log), never from the wording of its summary
# line, which differs between ctest 3.x and 4.x.
#
#   tools/ci/run-ctest.sh BUILD_DIR [--ctest PATH] [--known-flakes FILE] [-- extra ctest args]
#
# A test that fails is run once more. If it then passes it still fails the run unless
# FILE (default tests/known-flakes.txt) names it with a date and a cause: a flake is either
# known and explained, or a defect.
# The last line is "N passed, N failed, N skipped"; the exit status is 0 only when ctest ran at
# least one test and nothing failed.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="" ctest_bin="" flakes="$here/../../tests/known-flakes.txt" extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ctest) ctest_bin="$2"; shift 2 ;;
    --known-flakes) flakes="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -*) echo "run-ctest: unknown option $1" >&2; exit 2 ;;
    *) [[ -n "$build" ]] && { echo "run-ctest: one build folder only" >&2; exit 2; }; build="$1"; shift ;;
  esac
done
[[ -n "$build" && -d "$build" ]] || { echo "run-ctest: no build folder '${build}'" >&2; exit 2; }
[[ -n "$ctest_bin" ]] || ctest_bin="$(command -v ctest)" || { echo "run-ctest: no ctest" >&2; exit 2; }

build="$(cd "$build" && pwd)"
results="$build/ctest-results"
rm -rf "$results" && mkdir -p "$results"
rm -f "$build"/Testing/Temporary/LastTestsFailed*.log

"$ctest_bin" --test-dir "$build" --output-on-failure --no-tests=error \
  --output-junit "$results/first.xml" "${extra[@]}" 2>&1 | tee "$results/first.log"
first_rc=${PIPESTATUS[0]}
# ctest names each failed test here, "Not Run" ones (a missing executable) included; JUnit
# alone cannot tell those from skipped tests.
cat "$build"/Testing/Temporary/LastTestsFailed*.log 2>/dev/null | sed -E 's/^[0-9]+://' |
  sort -u >"$results/first-failed.txt"

rerun_rc=0
if [[ $first_rc -ne 0 && -s "$results/first-failed.txt" ]]; then
  echo "== ctest: failed, run once more: $(paste -sd' ' "$results/first-failed.txt")"
  "$ctest_bin" --test-dir "$build" --output-on-failure --rerun-failed \
    --output-junit "$results/rerun.xml" "${extra[@]}" 2>&1 | tee "$results/rerun.log"
  rerun_rc=${PIPESTATUS[0]}
fi

exec python3 "$here/ctest_verdict.py" --results "$results" --first-rc "$first_rc" \
  --rerun-rc "$rerun_rc" --known-flakes "$flakes"
