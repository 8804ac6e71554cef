"""A vLLM engine without a model: vLLM's real Scheduler with KvnodeConnector (its scheduler
role, made by vLLM's connector factory from the module path), and the connector's worker role
over a KV cache that vLLM's own allocate_kv_cache lays out in any KVCacheLayout. `step()` drives
one engine step as vLLM's model runner does (bind the metadata, start_load_kv, the "forward",
wait_for_save, get_finished), the forward writing KV that is a function of (layer, token,
position) so a load can be checked byte for byte.
"""

from __future__ import annotations

import json
import time
from itertools import count
from pathlib import Path
from typing import Dict, List, Optional, Set

import torch
from vllm import SamplingParams
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                         SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor, compute_layout_strides)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.utils import allocate_kv_cache

from conftest import SHAPE

from kvnode.vllm import KvnodeConnector

init_none_hash(sha256)
_ids = count(1)
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(SHAPE.layers)]


def model_dir(tmp: Path) -> Path:
    """A local Llama config (no weights: the scheduler reads the shape only)."""
    d = tmp / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
        "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": SHAPE.heads,
        "head_dim": SHAPE.head_size, "num_hidden_layers": SHAPE.layers, "vocab_size": 1000,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
    }))
    return d


def kv_cache_config(num_blocks: int, layout: KVCacheLayout) -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=SHAPE.block, num_kv_heads=SHAPE.heads,
                             head_size=SHAPE.head_size, dtype=torch.bfloat16)
    layer_stride, block_stride, *_ = compute_layout_strides(spec, num_blocks, len(LAYERS), layout)
    size = spec.page_size_bytes * num_blocks * len(LAYERS)
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[KVCacheTensor(size=size, layers=list(LAYERS), layer_stride=layer_stride,
                                        block_stride=block_stride)],
        kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)],
    )


def kv_value(layer: int, token: int, position: int) -> torch.Tensor:
    """The KV the fake forward writes for one token of one layer: [heads, 2 * head_size]."""
    base = (layer * 7919 + token * 104729 + position * 31) % 65521
    row = torch.arange(SHAPE.heads * 2 * SHAPE.head_size, dtype=torch.int64)
    return ((row * 2654435761 + base) % 30000 + 1).to(torch.int16).view(torch.bfloat16) \
        .reshape(SHAPE.heads, 2 * SHAPE.head_size)


class Engine:
    """Scheduler + worker connector over a node; `layout` is vLLM's physical KV order."""

    def __init__(self, tmp: Path, node: str, layout: KVCacheLayout = KVCacheLayout.LBHNC,
                 num_blocks: int = 64, max_batched: int = 64, role: str = "kv_both",
                 extra: Optional[dict] = None) -> None:
        model = ModelConfig(model=str(model_dir(tmp)), skip_tokenizer_init=True,
                            dtype="bfloat16", seed=0, max_model_len=4096)
        self.config = VllmConfig(
            model_config=model,
            scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=max_batched,
                                             max_model_len=4096, enable_chunked_prefill=True,
                                             is_encoder_decoder=False),
            cache_config=CacheConfig(block_size=SHAPE.block, enable_prefix_caching=False),
            kv_transfer_config=KVTransferConfig(
                kv_connector="KvnodeConnector", kv_connector_module_path="kvnode.vllm",
                kv_role=role, kv_connector_extra_config={"node": node, "timeout_s": 5,
                                                         "retry_s": 1, **(extra or {})}),
            device_config=DeviceConfig("cpu"),
        )
        self.config.cache_config.num_gpu_blocks = num_blocks
        kv_config = kv_cache_config(num_blocks, layout)
        self.scheduler = Scheduler(vllm_config=self.config, kv_cache_config=kv_config,
                                   log_stats=True,
                                   structured_output_manager=StructuredOutputManager(self.config),
                                   block_size=SHAPE.block)
        self.worker = KvnodeConnector(self.config, KVConnectorRole.WORKER, kv_config)
        with self.worker.get_mem_pool_context():
            self.kv = allocate_kv_cache(kv_config, torch.device("cpu"), layout)
        self.worker.register_kv_caches(self.kv)
        self.views = [self.kv[name] for name in LAYERS]
        self.requests: Dict[str, Request] = {}
        self.load_errors: Set[int] = set()
        self.finished_sending: Set[str] = set()
        self.finished_recving: Set[str] = set()
        self.outputs: List = []

    def add(self, prompt: List[int], max_tokens: int = 2) -> Request:
        req = Request(request_id=f"req-{next(_ids)}", prompt_token_ids=list(prompt),
                      sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                      pooling_params=None, mm_features=None,
                      block_hasher=get_request_block_hasher(SHAPE.block, sha256))
        self.requests[req.request_id] = req
        self.scheduler.add_request(req)
        return req

    def blocks_of(self, req: Request) -> List[int]:
        return list(self.scheduler.kv_cache_manager.get_block_ids(req.request_id)[0])

    def step(self):
        out = self.scheduler.schedule()
        self.outputs.append(out)
        w = self.worker
        w.handle_preemptions(out.kv_connector_metadata)
        w.bind_connector_metadata(out.kv_connector_metadata)
        w.start_load_kv(None)
        for req_id, n in out.num_scheduled_tokens.items():
            self.forward(self.requests[req_id], n)
        w.wait_for_save()
        sending, recving = w.get_finished(out.finished_req_ids)
        errors = w.get_block_ids_with_load_errors()
        w.clear_connector_metadata()
        self.finished_sending |= sending or set()
        self.finished_recving |= recving or set()
        self.load_errors |= errors
        req_ids = list(out.num_scheduled_tokens)
        runner = ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
            # A token only where the prefill is done (a partial prefill samples nothing).
            sampled_token_ids=[[7] if self.requests[r].num_computed_tokens
                               >= self.requests[r].num_prompt_tokens else [] for r in req_ids],
            logprobs=None, prompt_logprobs_dict={},
            pooler_output=None,
            kv_connector_output=KVConnectorOutput(finished_sending=sending,
                                                  finished_recving=recving,
                                                  invalid_block_ids=errors))
        self.scheduler.update_from_output(out, runner)
        return out

    def forward(self, req: Request, n: int) -> None:
        """Writes the KV of the step's n tokens (schedule() already counted them computed)."""
        start = req.num_computed_tokens - n
        tokens = req.all_token_ids
        blocks = self.blocks_of(req)
        for pos in range(start, min(start + n, len(tokens))):
            b, slot = blocks[pos // SHAPE.block], pos % SHAPE.block
            for layer, view in enumerate(self.views):
                view[b, :, slot, :] = kv_value(layer, tokens[pos], pos)

    def kv_matches(self, req: Request, upto: int) -> List[int]:
        """Positions < upto whose KV (any layer) is not what the forward writes."""
        blocks = self.blocks_of(req)
        tokens = req.all_token_ids
        bad = []
        for pos in range(upto):
            b, slot = blocks[pos // SHAPE.block], pos % SHAPE.block
            if any(not torch.equal(view[b, :, slot, :], kv_value(layer, tokens[pos], pos))
                   for layer, view in enumerate(self.views)):
                bad.append(pos)
        return bad

    def run(self, seconds: float = 30) -> None:
        """Steps until the scheduler has no requests left (or `seconds` passed). A finished
        request whose stores are queued keeps its blocks until the worker's thread stored them:
        the steps go on meanwhile, pausing a little as an idle engine would."""
        until = time.monotonic() + seconds
        while self.scheduler.has_requests() and time.monotonic() < until:
            self.step()
            time.sleep(0.002)

    def close(self) -> None:
        self.worker.shutdown()
        self.scheduler.connector.shutdown()
