"""The geometry of an SGLang host KV pool, and the page-major views kvnode reads it through.

SGLang's host pools (``MHATokenToKVPoolHost``, ``MLATokenToKVPoolHost``) keep one ``kv_buffer``
whose order depends on the layout. Every supported layout is a page-major view with strides::

    MHA  layer_first        [2, L, S, H, D]         -> [2, P, L, page, H, D]
         page_first         [2, S, L, H, D]         -> [2, P, page, L, H, D]
         page_first_direct  [2, P, L, page, H, D]      (as is)
         page_head          [2, P, H, page, L, D]      (as is)
    MLA  layer_first        [L, S, 1, D]            -> [P, L, page, 1, D]
         page_first         [S, L, 1, D]            -> [P, page, L, 1, D]
         page_first_direct  [P, L, page, 1, D]         (as is)

(S token slots, P = S // page pages.) Page p of that view, flattened, is exactly what SGLang's
``get_data_page`` gives for the page starting at slot ``p * page`` (its generic path's format).
Permuted once more, every layout is ``[P, 2, L, page, H, D]`` (MLA ``[P, L, page, 1, D]``): the
order of a kvnode chunk (KV_2LTD), in which the bounce buffer holds pages, so that the node
copies each layer's K and V of a page as one run. One page is one kvnode chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Tuple

import numpy as np

import kvnode

__all__ = ["Geometry", "geometry_of", "Bounce", "register_pages"]

_MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
_MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")


@dataclass(frozen=True)
class Geometry:
    mla: bool
    layout: str
    page_size: int  # tokens per page (one kvnode chunk)
    pages: int  # P
    layers: int  # L
    heads: int  # H (MLA: 1)
    head_dim: int  # D
    dtype: Any  # torch.dtype
    itemsize: int

    @property
    def page_bytes(self) -> int:
        """Bytes of one page: K and V (MLA: the latent) of every layer."""
        parts = 1 if self.mla else 2
        return parts * self.layers * self.page_size * self.heads * self.head_dim * self.itemsize

    @property
    def rest(self) -> Tuple[int, ...]:
        """One page's dims in the page-major view (after [2, P] or [P])."""
        L, n, H, D = self.layers, self.page_size, self.heads, self.head_dim
        if self.mla:
            return (n, L, 1, D) if self.layout == "page_first" else (L, n, 1, D)
        return {"layer_first": (L, n, H, D), "page_first": (n, L, H, D),
                "page_first_direct": (L, n, H, D), "page_head": (H, n, L, D)}[self.layout]

    def pages_view(self, kv_buffer: Any) -> Any:
        """The pool's kv_buffer as its page-major view (a view: no copy)."""
        P, n = self.pages, self.page_size
        if self.mla:
            if self.layout == "layer_first":
                return kv_buffer[:, : P * n].view(self.layers, P, n, 1, self.head_dim) \
                    .permute(1, 0, 2, 3, 4)
            if self.layout == "page_first":
                return kv_buffer[: P * n].view(P, n, self.layers, 1, self.head_dim)
            return kv_buffer
        if self.layout == "layer_first":
            return kv_buffer[:, :, : P * n].view(2, self.layers, P, n, self.heads, self.head_dim) \
                .permute(0, 2, 1, 3, 4, 5)
        if self.layout == "page_first":
            return kv_buffer[:, : P * n].view(2, P, n, self.layers, self.heads, self.head_dim)
        return kv_buffer

    def _page_order(self) -> Tuple[int, ...]:
        """The permutation taking one page's dims ([2, *rest] for MHA, [*rest] for MLA) to the
        chunk's order: MHA [2, L, page, H, D], MLA [L, page, 1, D]."""
        if self.mla:
            return (1, 0, 2, 3) if self.layout == "page_first" else (0, 1, 2, 3)
        return {"page_first": (0, 2, 1, 3, 4), "page_head": (0, 3, 2, 1, 4)}.get(
            self.layout, (0, 1, 2, 3, 4))

    def chunk_order(self, page: Any) -> Any:
        """One page in the pool's order (get_data_page's shape, unflattened) as a view in the
        chunk's order."""
        return page.permute(*self._page_order())

    def chunk_view(self, kv_buffer: Any) -> Any:
        """The pool's kv_buffer as [P, 2, L, page, H, D] (MLA [P, L, page, 1, D]), a view."""
        pages = self.pages_view(kv_buffer)
        if self.mla:
            return pages.permute(0, *(1 + d for d in self._page_order()))
        first = pages.permute(1, 0, *range(2, pages.dim()))  # [P, 2, *rest]
        return first.permute(0, *(1 + d for d in self._page_order()))


def _fail(what: str) -> ValueError:
    return ValueError(f"kvnode.sglang: {what}")


def geometry_of(pool: Any) -> Geometry:
    """The pool's geometry; ValueError naming what kvnode cannot hold."""
    layout = getattr(pool, "layout", None)
    kv = getattr(pool, "kv_buffer", None)
    page = int(getattr(pool, "page_size", 0) or 0)
    if kv is None or not hasattr(kv, "shape") or page <= 0:
        raise _fail(f"{type(pool).__name__} is not a host KV pool kvnode knows (it needs "
                    "kv_buffer, layout and page_size: MHATokenToKVPoolHost or "
                    "MLATokenToKVPoolHost)")
    if str(getattr(kv, "device", "cpu")) != "cpu":
        raise _fail(f"the host pool is on {kv.device}, not in host memory")
    mla = type(pool).__name__.startswith("MLA") or hasattr(pool, "kv_cache_dim")
    if int(getattr(pool, "dcp_size", 1) or 1) != 1:
        raise _fail("decode context parallelism (dcp_size > 1) is not supported")
    shape = tuple(kv.shape)
    if mla:
        if layout not in _MLA_LAYOUTS:
            raise _fail(f"MLA host layout {layout!r} is not supported (supported: "
                        f"{', '.join(_MLA_LAYOUTS)})")
        if layout == "layer_first":
            L, S, one, D = shape
            P = S // page
        elif layout == "page_first":
            S, L, one, D = shape
            P = S // page
        else:
            P, L, n, one, D = shape
        H = 1
    else:
        if layout not in _MHA_LAYOUTS:
            raise _fail(f"MHA host layout {layout!r} is not supported (supported: "
                        f"{', '.join(_MHA_LAYOUTS)})")
        head_dim, v_head_dim = getattr(pool, "head_dim", None), getattr(pool, "v_head_dim", None)
        if v_head_dim is not None and head_dim is not None and v_head_dim != head_dim:
            raise _fail(f"K and V head sizes differ ({head_dim} and {v_head_dim})")
        if layout == "layer_first":
            two, L, S, H, D = shape
            P = S // page
        elif layout == "page_first":
            two, S, L, H, D = shape
            P = S // page
        elif layout == "page_first_direct":
            two, P, L, n, H, D = shape
        else:
            two, P, H, n, L, D = shape
    if P <= 0:
        raise _fail(f"the host pool holds no whole page (kv_buffer {shape}, page {page})")
    return Geometry(mla=mla, layout=layout, page_size=page, pages=P, layers=L, heads=H,
                    head_dim=D, dtype=kv.dtype, itemsize=kv.element_size())


def register_pages(client: "kvnode.Client", geo: Geometry, chunks: Any,
                   process_memory: Any = None) -> "kvnode.KVCache":
    """Registers pages in the chunk's order (a Bounce's, or a pool's Geometry.chunk_view): per
    layer K and V views [P, H, page, D] ("strided"), or the latent [P, 1, page, D]
    ("packed_mla"); block i is page i."""
    layers: List[Any] = []
    for layer in range(geo.layers):
        if geo.mla:
            layers.append(chunks[:, layer].permute(0, 2, 1, 3))
        else:
            layers.append((chunks[:, 0, layer].permute(0, 2, 1, 3),
                           chunks[:, 1, layer].permute(0, 2, 1, 3)))
    return client.register_kv_cache(layers, block_size=geo.page_size,
                                    layout="packed_mla" if geo.mla else "strided",
                                    process_memory=process_memory)


class Bounce:
    """`capacity` pages in the chunk's own order ([B, 2, L, page, H, D], MLA [B, L, page, 1, D]),
    in memory the node maps (kvnode.host_array): the node copies each layer's K and V of a page
    as one run, and pages travel between it and the host pool with one torch copy."""

    def __init__(self, geo: Geometry, capacity: int) -> None:
        import torch

        self.geo = geo
        self.capacity = capacity
        self.memory = kvnode.host_array(capacity * geo.page_bytes, dtype=np.uint8)
        flat = torch.from_numpy(self.memory).view(geo.dtype)
        L, n, H, D = geo.layers, geo.page_size, geo.heads, geo.head_dim
        self.pages = flat.view(capacity, L, n, 1, D) if geo.mla else \
            flat.view(capacity, 2, L, n, H, D)

    def register(self, client: "kvnode.Client") -> "kvnode.KVCache":
        """Registers the buffer with the node (it maps it)."""
        return register_pages(client, self.geo, self.pages)

    def gather(self, pool_chunks: Any, page_ids: Any, at: int = 0) -> None:
        """Bounce pages [at, at + n) = the pool's pages page_ids (a LongTensor of n);
        pool_chunks is Geometry.chunk_view of the pool."""
        import torch

        torch.index_select(pool_chunks, 0, page_ids, out=self.pages[at:at + int(page_ids.numel())])

    def scatter(self, pool_chunks: Any, page_ids: Any, at: int = 0) -> None:
        """The pool's pages page_ids = bounce pages [at, at + n)."""
        pool_chunks.index_copy_(0, page_ids, self.pages[at:at + int(page_ids.numel())])
