// The runs of a chunk between a paged KV cache and one KV_2LTD chunk, as an inline template:
// kv_layout.hpp's for_each_run without its std::function, for a caller that copies each run
// itself. A run is the largest contiguous piece the strides allow: the tokens of one block when
// tokens and heads are packed (NHD), else a token's heads when heads are packed, else one
// head_size row (HND: 256 bytes for Llama, millions per request, so a stored segment and an
// indirect call per run cost as much as the copies; measured in the node).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kvnode/client/kv_layout.hpp"

namespace kvnode::client {
namespace detail {

// gather()'s checks (`span_name` names the chunk's buffer in the error).
Status check_runs(const KvLayout& l, std::span<const std::uint32_t> block_ids,
                  std::size_t first_token, std::size_t tokens, std::size_t span_bytes,
                  const char* span_name);

// The runs of `tokens` tokens of one tensor; `chunk` is this (kv, layer)'s first row's offset.
// A template, so gather's and scatter's memcpy inline into the loop: an HND cache's runs are one
// head_size row each (256 bytes for Llama), and an indirect call per row halved the copy rate.
template <class Each>
void tensor_runs(const KvLayout& l, const KvTensor& t, std::span<const std::uint32_t> block_ids,
                 std::size_t first_token, std::size_t tokens, std::size_t chunk, const Each& each) {
  const std::size_t row = std::size_t{l.head_size} * l.elem_bytes;
  const std::size_t token_bytes = row * l.kv_heads;
  const bool heads_packed = l.kv_heads == 1 || t.head_stride == row;
  const bool tokens_packed = heads_packed && (l.block_size == 1 || t.token_stride == token_bytes);
  std::byte* const tensor = t.base + t.offset;
  std::size_t done = 0;
  while (done < tokens) {
    const std::size_t tok = first_token + done;
    const std::size_t in_block = tok % l.block_size;
    const std::size_t run = std::min<std::size_t>(l.block_size - in_block, tokens - done);
    std::byte* block = tensor + block_ids[tok / l.block_size] * t.block_stride;
    const std::size_t out = chunk + done * token_bytes;
    if (tokens_packed) {
      each({block + in_block * t.token_stride, out, run * token_bytes});
    } else {
      for (std::size_t i = 0; i < run; ++i) {
        std::byte* src = block + (in_block + i) * t.token_stride;
        if (heads_packed) {
          each({src, out + i * token_bytes, token_bytes});
          continue;
        }
        for (std::size_t h = 0; h < l.kv_heads; ++h) {
          each({src + h * t.head_stride, out + i * token_bytes + h * row, row});
        }
      }
    }
    done += run;
  }
}

template <class Each>
void chunk_runs(const KvLayout& l, std::span<const std::uint32_t> block_ids,
                std::size_t first_token, std::size_t tokens, const Each& each) {
  const std::size_t per_layer = tokens * l.kv_heads * l.head_size * l.elem_bytes;
  const std::size_t per_kv = per_layer * l.layers.size();
  for (std::size_t i = 0; i < l.layers.size(); ++i) {
    const KvLayerTensors& lt = l.layers[i];
    tensor_runs(l, lt.k, block_ids, first_token, tokens, i * per_layer, each);
    if (l.format == KvFormat::kKeyValue) {
      tensor_runs(l, lt.v, block_ids, first_token, tokens, per_kv + i * per_layer, each);
    }
  }
}

}  // namespace detail

// Checks the request as for_each_run does, then calls each(const KvRun&) for every run.
template <class Each>
Status visit_runs(const KvLayout& layout, std::span<const std::uint32_t> block_ids,
                  std::size_t first_token, std::size_t tokens, std::size_t chunk_span_bytes,
                  const Each& each) {
  if (Status st =
          detail::check_runs(layout, block_ids, first_token, tokens, chunk_span_bytes, "chunk");
      !st)
    return st;
  detail::chunk_runs(layout, block_ids, first_token, tokens, each);
  return {};
}

}  // namespace kvnode::client
