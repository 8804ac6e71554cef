#!/usr/bin/env bash
# The one prepared GPU check (issue 21: the engine KV path, and every GPU test). Run here, on the
# build machine:
#
#   bash tools/gpu-check.sh      (or ./dev.sh gpu-check, which also prints the `run` call)
#
# It builds build/ (RelWithDebInfo; configured as ./dev.sh build does when it is not yet) for the
# binaries the check needs, under the shared build lock, packs them with their Debian libraries
# into .gpu-check/ (../shared/tools/device-bundle.sh; .gpu-check/ goes in .git/info/exclude), and
# writes .gpu-check/run.sh, what the GPU machine runs through the device tool:
#
#   run(command="bash .gpu-check/run.sh", carry=[".gpu-check"], timeout_s=600)
#
# run.sh's header says what it runs and how it makes the build machine's compiled-in paths valid
# there. Run here, run.sh must not crash either: the GPU steps say SKIPPED or FAIL and the host
# point of kvbench engine still runs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUNDLE=.gpu-check
LIMIT_MIB=64  # what travels to the GPU machine: the working tree and the carried bundle together
TARGETS=(kvnode kvctl kvcontroller kvbench gpu_test node_test transfer_test transfer_test_peer)
LIBRARIES=(kvnode_client_c)  # built too; the Python package loads it
BUNDLER="$ROOT/../shared/tools/device-bundle.sh"
[[ -f "$BUNDLER" ]] || { echo "gpu-check: $BUNDLER is missing" >&2; exit 2; }

# --- build ---------------------------------------------------------------------------------------
if [[ ! -f build/build.ninja ]]; then
  args=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVNODE_BUILD_BENCH=ON)
  [[ -d "$ROOT/../shared" ]] && args+=(-DKVNODE_SHARED_DIR="$(cd "$ROOT/../shared" && pwd)")
  [[ -x /usr/bin/python3 ]] && args+=(-DPython3_EXECUTABLE=/usr/bin/python3)
  "${CMAKE:-cmake}" -S "$ROOT" -B build -Wno-unused-cli "${args[@]}"
fi
type="$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' build/CMakeCache.txt)"
[[ "$type" == RelWithDebInfo ]] || echo "gpu-check: note: build/ is $type, not RelWithDebInfo"
grep -q '^CMAKE_CUDA_COMPILER:.*nvcc' build/CMakeCache.txt ||
  echo "gpu-check: note: build/ was configured without nvcc: no copy kernel, GPU steps will fail"
echo "== gpu-check: building ${TARGETS[*]} (build/, under /tmp/kvnode-build.lock)"
flock /tmp/kvnode-build.lock "${CMAKE:-cmake}" --build build --parallel "${KVNODE_BUILD_JOBS:-2}" \
  --target "${TARGETS[@]}" "${LIBRARIES[@]}"

# --- bundle --------------------------------------------------------------------------------------
exclude="$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qxF "/$BUNDLE/" "$exclude" 2>/dev/null || echo "/$BUNDLE/" >>"$exclude"
bins=()
for t in "${TARGETS[@]}"; do bins+=("build/bin/$t"); done
# ucx_perftest: kvbench transfer's ceiling for the UCX paths, measured there in the same run.
command -v ucx_perftest >/dev/null && bins+=("$(command -v ucx_perftest)")
bash "$BUNDLER" "$BUNDLE" "${bins[@]}" >/dev/null
# The C client library for the Python package's GPU test (it needs only libstdc++).
cp -L build/client/libkvnode_client.so.0 "$BUNDLE/lib/"

# node_test and transfer_test start kvnode, kvcontroller, kvctl and transfer_test_peer by the
# absolute paths of this build (KVNODE_PATH etc.): run.sh recreates that folder there.
BUILD_BIN="$(cd build/bin && pwd -P)"
grep -qF "$BUILD_BIN/kvnode" build/bin/node_test ||
  echo "gpu-check: note: node_test does not name $BUILD_BIN/kvnode; its process tests may not find it"

{
  echo '#!/usr/bin/env bash'
  echo "# Written by tools/gpu-check.sh on $(hostname) at $(date -u +%FT%TZ); do not edit."
  cat <<'HEADER'
# The GPU check, run on the H200 machine from the repository root through the device tool:
#   run(command="bash .gpu-check/run.sh", carry=[".gpu-check"], timeout_s=600)
# Steps, each bounded by `timeout` (about 7 minutes in all), each ending in one line
# "gpu-check: STEP PASS|FAIL|SKIPPED ...":
#   nvidia-smi -L; gpu_test (all; the GPU tests skip themselves without a GPU);
#   node_test --gtest_filter=KvEngineGpu*:DevicePool*; transfer_test (device pools, GPUDirect);
#   kvbench engine --memory all --json (host, and pinned and device where there is a GPU);
#   kvbench transfer --json: same-host moves of 64 x 32 MiB between host pools (vs memcpy with as
#   many threads) and between device pools (vs a device-to-device copy), and UCX shared memory and
#   tcp pulls of 8 x 32 MiB (vs ucx_perftest), all on that machine's cores;
#   the Python package with torch CUDA tensors (tests/python/test_gpu.py) where torch is.
# Logs, the JSON lines and summary.txt go to $OUT when it is set (the device tool brings them
# back), else to .gpu-check/out/. Exit 0 when no step failed.
#
# Compiled-in paths: node_test starts kvnode, kvcontroller and kvctl, and transfer_test its peer,
# by the absolute paths of the build machine (KVNODE_PATH="<BUILD_BIN>/kvnode" and the like,
# BUILD_BIN below). Where that folder does not exist (the GPU machine; commands run as root there)
# this script makes it a symbolic link to the bundle's bin/, so those paths resolve; a link left by
# an earlier run is pointed here again; a real folder (the build machine itself) is used as it is.
# The children find the bundle's libraries through env.sh's LD_LIBRARY_PATH, which they inherit,
# and UCX its transport modules through UCX_MODULE_DIR (the bundle's lib/ucx). kvbench starts the
# kvnode and kvcontroller beside itself (the bundle's bin/). KVNODE_SHARED_DIR (the conformance
# data) is not carried: no GPU test reads it.
HEADER
  echo "BUILD_BIN=$BUILD_BIN"
  cat <<'BODY'
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=/dev/null
. "$HERE/env.sh"
export UCX_MODULE_DIR="${UCX_MODULE_DIR:-$HERE/lib/ucx}"
LOGS="${OUT:-$HERE/out}"
mkdir -p "$LOGS"
: >"$LOGS/summary.txt"
FAILED=0

say() { echo "gpu-check: $*" | tee -a "$LOGS/summary.txt"; }

if [[ -L "$BUILD_BIN" || ! -e "$BUILD_BIN" ]]; then
  if ! { mkdir -p "$(dirname "$BUILD_BIN")" && ln -sfn "$HERE/bin" "$BUILD_BIN"; }; then
    say "note: could not link $BUILD_BIN to $HERE/bin: the node_test process tests will fail"
  fi
else
  say "note: $BUILD_BIN is a real folder (the build machine?): its binaries are used"
fi

# gtest NAME FILTER SECONDS: one test binary; PASS, SKIPPED (nothing matched, or every test
# skipped itself) or FAIL, with the failed tests' names.
gtest() {
  local name="$1" filter="$2" seconds="$3" log="$LOGS/$1.log" rc ran skipped t0=$SECONDS
  timeout -k 10 "$seconds" "$HERE/bin/$name" --gtest_filter="$filter" >"$log" 2>&1
  rc=$?
  ran="$(sed -nE 's/^\[==========\] ([0-9]+) tests? from .* ran\..*/\1/p' "$log" | tail -n1)"
  skipped="$(sed -nE 's/^\[  SKIPPED \] ([0-9]+) tests?.*/\1/p' "$log" | tail -n1)"
  ran="${ran:-0}" skipped="${skipped:-0}"
  local took="$((SECONDS - t0))s"
  if [[ $rc -eq 0 && $ran -eq 0 ]]; then
    say "$name SKIPPED (no test matches $filter) $took"
  elif [[ $rc -eq 0 && $skipped -eq $ran ]]; then
    local why
    why="$(grep -m1 -A1 ': Skipped$' "$log" | tail -n1 | cut -c1-100)"
    say "$name SKIPPED ($ran tests skipped themselves: ${why:-see $name.log}) $took"
  elif [[ $rc -eq 0 ]]; then
    say "$name PASS ($ran tests, $skipped skipped) $took"
  else
    FAILED=$((FAILED + 1))
    local why="exit $rc"
    [[ $rc -eq 124 || $rc -eq 137 ]] && why="timed out after ${seconds}s"
    say "$name FAIL ($why; log $name.log) $took"
    grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | sort -u | sed 's/^/    /' | tee -a "$LOGS/summary.txt"
    [[ $rc -eq 124 || $rc -eq 137 ]] && tail -n 20 "$log" | sed 's/^/    | /'
  fi
}

t0=$SECONDS
if ! command -v nvidia-smi >/dev/null; then
  say "nvidia-smi SKIPPED (not installed: no GPU here)"
elif timeout 15 nvidia-smi -L >"$LOGS/nvidia-smi.log" 2>&1; then
  cat "$LOGS/nvidia-smi.log"
  say "nvidia-smi PASS $((SECONDS - t0))s"
else
  say "nvidia-smi FAIL ($(head -n1 "$LOGS/nvidia-smi.log"))"
  FAILED=$((FAILED + 1))
fi

gtest gpu_test '*' 45
gtest node_test 'KvEngineGpu*:DevicePool*' 75
gtest transfer_test '*DevicePool*:PlanePoolPath*:UcxMemoryTypes*:SameHost*:*TwoProcesses*' 60
gtest node_test '*same_host*:SameHost*' 90

# Same-host and UCX transfer figures (issue 23's targets), one JSON line per point.
t0=$SECONDS
rc=0
: >"$LOGS/kvbench_transfer.json"
for point in "--same-host --pool host --chunk-bytes 33554432 --batch 64 --op push" \
  "--same-host --pool device --chunk-bytes 33554432 --batch 64 --op push" \
  "--same-host --pool device --chunk-bytes 33554432 --batch 64 --op pull" \
  "--tls default --chunk-bytes 33554432 --batch 8 --op pull" \
  "--tls tcp --chunk-bytes 33554432 --batch 8 --op pull"; do
  # shellcheck disable=SC2086
  timeout -k 10 90 "$HERE/bin/kvbench" transfer $point --iters 20 --json \
    >>"$LOGS/kvbench_transfer.json" 2>>"$LOGS/kvbench_transfer.log" || rc=$?
done
cat "$LOGS/kvbench_transfer.json"
if [[ $rc -eq 0 ]]; then
  say "kvbench_transfer PASS ($(grep -c '"op"' "$LOGS/kvbench_transfer.json") points) $((SECONDS - t0))s"
else
  FAILED=$((FAILED + 1))
  say "kvbench_transfer FAIL (exit $rc; log kvbench_transfer.log) $((SECONDS - t0))s"
  tail -n 20 "$LOGS/kvbench_transfer.log" | sed 's/^/    | /'
fi

t0=$SECONDS
timeout -k 10 120 "$HERE/bin/kvbench" engine --memory all --json >"$LOGS/kvbench_engine.json" \
  2>"$LOGS/kvbench_engine.log"
rc=$?
cat "$LOGS/kvbench_engine.json"
points="$(grep -c '"gbps"' "$LOGS/kvbench_engine.json")"
if [[ $rc -eq 0 ]]; then
  kinds="$(grep -oE '"memory":"[a-z]+","op":"store",' "$LOGS/kvbench_engine.json" | cut -d'"' -f4 | paste -sd, -)"
  note="$(grep -m1 'skipped' "$LOGS/kvbench_engine.log" || true)"
  say "kvbench_engine PASS ($points points: ${kinds:-none}${note:+; $note}) $((SECONDS - t0))s"
else
  FAILED=$((FAILED + 1))
  say "kvbench_engine FAIL (exit $rc; log kvbench_engine.log) $((SECONDS - t0))s"
  tail -n 20 "$LOGS/kvbench_engine.log" | sed 's/^/    | /'
fi

t0=$SECONDS
if ! python3 -c 'import torch, numpy' >/dev/null 2>&1; then
  say "python_gpu SKIPPED (no python3 with torch and numpy here)"
elif KVNODE_CLIENT_LIB="$HERE/lib/libkvnode_client.so.0" KVNODE_PATH="$HERE/bin/kvnode" \
  KVCONTROLLER_PATH="$HERE/bin/kvcontroller" PYTHONPATH="$PWD/python" PYTHONUNBUFFERED=1 \
  timeout -k 10 90 python3 tests/python/test_gpu.py >"$LOGS/python_gpu.log" 2>&1; then
  say "python_gpu PASS ($(grep -c PASS "$LOGS/python_gpu.log") passed, $(grep -c SKIPPED "$LOGS/python_gpu.log") skipped) $((SECONDS - t0))s"
else
  FAILED=$((FAILED + 1))
  say "python_gpu FAIL (log python_gpu.log) $((SECONDS - t0))s"
  tail -n 20 "$LOGS/python_gpu.log" | sed 's/^/    | /'
fi

say "done: $FAILED step(s) failed; logs in $LOGS"
[[ $FAILED -eq 0 ]]
BODY
} >"$BUNDLE/run.sh"
chmod +x "$BUNDLE/run.sh"

bundle_mib="$(du -sm "$BUNDLE" | cut -f1)"
tree_mib="$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -n1 |
  awk '{printf "%d", $1 / 1048576 + 0.5}')"
echo "== gpu-check: $BUNDLE is $bundle_mib MiB, the working tree ~$tree_mib MiB:" \
  "$((bundle_mib + tree_mib)) of the $LIMIT_MIB MiB that travel"
if ((bundle_mib + tree_mib >= LIMIT_MIB)); then
  echo "gpu-check: too big to travel: strip what the check does not need" >&2
  exit 1
fi
