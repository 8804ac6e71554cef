"""The connector's scheduler side: how much of a prompt the nodes hold, and each step's plan.

A prefix counts when every tensor-parallel rank's node holds it (each rank stores its own
shard). Held here, it loads synchronously at the start of the step (a local copy); held only at
a peer (the controller's P2P lookup), it loads asynchronously: the worker pulls it to its node
and copies it in off the step, and vLLM waits for ``get_finished`` before scheduling the request.
Prompt chunks are stored in the step that computed them (whole chunks while the prefill runs,
the rest when it ends); a request whose stores are planned keeps its blocks after it finishes
until every worker reports them stored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .._hashes import node_chunk_hashes
from ._config import ConnectorConfig
from ._link import NodeLink
from ._meta import Load, Save, StepMeta

__all__ = ["SchedulerSide"]

log = logging.getLogger("kvnode.vllm")


@dataclass
class _Request:
    tokens: List[int]         # the prompt
    block_ids: List[int] = field(default_factory=list)
    load: Optional[Load] = None  # planned by update_state_after_alloc, sent by the next meta
    saved: int = 0            # prompt tokens whose store is planned (or known held)
    saves_planned: bool = False


class SchedulerSide:
    def __init__(self, config: ConnectorConfig, block_size: int, tp_size: int) -> None:
        self.config = config
        self.block_size = block_size
        self.links = [NodeLink(config.node_path(r), config.timeout_s, config.retry_s,
                               f"scheduler (rank {r}'s node)") for r in range(tp_size)]
        self.requests: Dict[str, _Request] = {}
        self._pending: Dict[str, _Request] = {}  # asked about, not yet scheduled
        self.chunk_size = 0  # the nodes' chunk (tokens), once one answered

    # -- lookup -----------------------------------------------------------------------------

    def _held(self, tokens: List[int]) -> tuple:
        """(local tokens every rank's node holds, tokens every rank holds or can pull)."""
        local = remote = len(tokens)
        chains: Dict[tuple, List[int]] = {}  # the hashes per chain (every rank's is the same)
        for link in self.links:
            got = link.call(lambda c: self._ask(c, tokens, chains), None)
            if got is None:
                return 0, 0
            here, there = got
            local, remote = min(local, here), min(remote, there)
        return local, remote

    def _ask(self, client: Any, tokens: List[int], chains: Dict[tuple, List[int]]) -> tuple:
        """(tokens this node holds, tokens it holds or a peer does). By chunk hash, computed here
        with the node's chain (a 32k-token prompt costs half of sending its tokens); a node too
        old to say which chain it uses is asked by tokens."""
        info = client.info
        if not info["hash_generation"]:
            if self.config.peers:
                got = client.lookup_peers(tokens)
                return got["tokens"], max(got["tokens"], got["peer_tokens"])
            here = client.lookup(tokens)
            return here, here
        chain = (info["hash_generation"], info["hash_init"], info["none_hash"],
                 info["chunk_size"], info["save_unfull_chunk"])
        hashes = chains.get(chain)
        if hashes is None:
            hashes = chains[chain] = node_chunk_hashes(tokens, info)
        as_tokens = lambda chunks: min(chunks * info["chunk_size"], len(tokens))  # noqa: E731
        if self.config.peers:
            got = client.lookup_peers_chunks(hashes)
            here = as_tokens(got["chunks"])
            return here, max(here, as_tokens(got["peer_chunks"]))
        here = as_tokens(client.lookup_chunks(hashes))
        return here, here

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple:
        req_id = request.request_id
        tokens = list(request.prompt_token_ids or [])
        state = _Request(tokens=tokens)
        self._pending[req_id] = state
        if not self.config.load or len(tokens) < 2:
            return 0, False
        local, remote = self._held(tokens)
        # A hit is at most len(prompt) - 1 tokens: vLLM computes the last one for its logits.
        usable = lambda n: min(n, len(tokens) - 1)  # noqa: E731
        if usable(local) > num_computed_tokens:
            hit, is_remote, asked = usable(local), False, local
        elif usable(remote) > num_computed_tokens:
            hit, is_remote, asked = usable(remote), True, remote
        else:
            state.saved = max(local, 0)
            return 0, False
        # The load names the node's chunks by all of their tokens; vLLM gives blocks up to the
        # hit only (an asynchronous load's are all it allocates). A partial last chunk past the
        # hit's last block is left out: whole chunks only then.
        if asked > -(-hit // self.block_size) * self.block_size and self._chunk():
            asked = asked // self.chunk_size * self.chunk_size
            hit = min(hit, asked)
            if hit <= num_computed_tokens:
                return 0, False
        state.load = Load(req_id=req_id, tokens=tokens[:asked], block_ids=[], hit_tokens=hit,
                          remote=is_remote)
        state.saved = asked  # the nodes hold these: nothing to store again
        return hit - num_computed_tokens, is_remote

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        req_id = request.request_id
        state = self._pending.pop(req_id, None) or self.requests.get(req_id)
        if state is None:
            state = _Request(tokens=list(request.prompt_token_ids or []))
        earlier = self.requests.get(req_id)
        if earlier is not None and earlier is not state:  # resumed after a preemption
            state.saves_planned |= earlier.saves_planned  # its stores still hold its blocks
        self.requests[req_id] = state
        if num_external_tokens == 0 or state.load is None:
            state.load = None  # vLLM loads nothing (its own prefix cache covered it, or no hit)
            return
        ids = blocks.get_block_ids()
        block_ids = list(ids[0]) if ids else []
        state.load.block_ids = block_ids[: -(-len(state.load.tokens) // self.block_size)]

    # -- each step --------------------------------------------------------------------------

    def build_connector_meta(self, out: Any) -> StepMeta:
        meta = StepMeta(preempted=bool(getattr(out, "preempted_req_ids", None)))
        # Every load planned since the last step: a synchronous one's request runs in this step,
        # an asynchronous one's waits (not scheduled) until the worker reports it loaded.
        for state in self.requests.values():
            if state.load is not None and state.load.block_ids:
                meta.loads.append(state.load)
                state.load = None
        for new in out.scheduled_new_reqs:
            state = self.requests.get(new.req_id)
            if state is None:
                state = self.requests[new.req_id] = _Request(tokens=list(new.prompt_token_ids or []))
            state.block_ids = list(new.block_ids[0]) if new.block_ids else []
            self._plan_save(meta, new.req_id, state, new.num_computed_tokens, out)
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self.requests.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                if req_id in cached.resumed_req_ids:
                    state.block_ids = list(new_ids[0])
                else:
                    state.block_ids.extend(new_ids[0])
            self._plan_save(meta, req_id, state, cached.num_computed_tokens[i], out)
        return meta

    def _chunk(self) -> int:
        """The nodes' chunk (tokens), from rank 0's node once it answered; 0 while it is down."""
        if not self.chunk_size:
            self.chunk_size = int(self.links[0].call(lambda c: c.info["chunk_size"], 0))
        return self.chunk_size

    def _plan_save(self, meta: StepMeta, req_id: str, state: _Request, computed: int,
                   out: Any) -> None:
        if not self.config.save or not self._chunk():
            return
        scheduled = out.num_scheduled_tokens.get(req_id, 0)
        done = min(computed + scheduled, len(state.tokens))
        if done < len(state.tokens):
            done -= done % self.chunk_size  # whole chunks while the prefill runs
        if done <= state.saved:
            return
        blocks = state.block_ids[: -(-done // self.block_size)]
        if len(blocks) * self.block_size < done:
            return  # not every block is known yet (cannot happen with one KV cache group)
        meta.saves.append(Save(req_id=req_id, tokens=state.tokens[:done], block_ids=blocks))
        state.saved = done
        state.saves_planned = True

    def request_finished(self, request: Any, block_ids: List[int]) -> tuple:
        state = self.requests.pop(request.request_id, None)
        self._pending.pop(request.request_id, None)
        # Planned stores read these blocks: keep them until the workers report them stored.
        return bool(state is not None and state.saves_planned), None

    def close(self) -> None:
        for link in self.links:
            link.close()
