// Runs of a chunk between a paged KV cache and one KV_2LTD chunk, and the host gather/scatter
// built on them. Every check runs before the first run is visited. A run is the largest
// contiguous piece the strides allow: the tokens of one block when tokens and heads are packed
// (NHD), else a token's heads when heads are packed, else one head_size row (HND).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "kvnode/client/kv_layout.hpp"

namespace kvnode::client {
namespace {

Status check_request(const KvLayout& l, std::span<const std::uint32_t> block_ids,
                     std::size_t first_token, std::size_t tokens, std::size_t span_bytes,
                     const char* span_name) {
  if (Status st = validate(l); !st) return wrap_error("layout: ", st.error());
  auto want = chunk_bytes(l, tokens);
  if (!want) return want.error();
  if (span_bytes != *want) {
    return make_error(std::string(span_name) + ": " + std::to_string(span_bytes) +
                      " bytes, but a chunk of " + std::to_string(tokens) + " tokens takes " +
                      std::to_string(*want) + " bytes");
  }
  // Checked: a table too long to count in size_t holds more tokens than any request can name.
  std::size_t have = 0;
  if (__builtin_mul_overflow(block_ids.size(), std::size_t{l.block_size}, &have)) {
    have = SIZE_MAX;
  }
  if (first_token > have || tokens > have - first_token) {
    return make_error("tokens: [" + std::to_string(first_token) + ", " +
                      std::to_string(first_token) + " + " + std::to_string(tokens) + ") past the " +
                      std::to_string(have) + " tokens of " + std::to_string(block_ids.size()) +
                      " blocks");
  }
  const std::size_t first_block = first_token / l.block_size;
  const std::size_t end_block = (first_token + tokens - 1) / l.block_size + 1;
  for (std::size_t i = first_block; i < end_block; ++i) {
    if (block_ids[i] >= l.num_blocks) {
      return make_error("block_ids[" + std::to_string(i) + "]: " + std::to_string(block_ids[i]) +
                        " is out of range (num_blocks " + std::to_string(l.num_blocks) + ")");
    }
  }
  return {};
}

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

}  // namespace

Status for_each_run(const KvLayout& layout, std::span<const std::uint32_t> block_ids,
                    std::size_t first_token, std::size_t tokens, std::size_t chunk_span_bytes,
                    const std::function<void(const KvRun&)>& each) {
  if (Status st = check_request(layout, block_ids, first_token, tokens, chunk_span_bytes, "chunk");
      !st) {
    return st;
  }
  chunk_runs(layout, block_ids, first_token, tokens, each);
  return {};
}

Status gather(const KvLayout& layout, std::span<const std::uint32_t> block_ids,
              std::size_t first_token, std::size_t tokens, std::span<std::byte> out) {
  if (Status st = check_request(layout, block_ids, first_token, tokens, out.size(), "out"); !st) {
    return st;
  }
  chunk_runs(layout, block_ids, first_token, tokens, [&out](const KvRun& r) {
    std::memcpy(out.data() + r.chunk_offset, r.cache, r.bytes);
  });
  return {};
}

Status scatter(const KvLayout& layout, std::span<const std::uint32_t> block_ids,
               std::size_t first_token, std::size_t tokens, std::span<const std::byte> in) {
  if (Status st = check_request(layout, block_ids, first_token, tokens, in.size(), "in"); !st) {
    return st;
  }
  chunk_runs(layout, block_ids, first_token, tokens,
             [&in](const KvRun& r) { std::memcpy(r.cache, in.data() + r.chunk_offset, r.bytes); });
  return {};
}

}  // namespace kvnode::client
