// The checks of a request for a chunk's runs (kv_runs.hpp), and the host gather/scatter and
// for_each_run built on the runs. Every check runs before the first run is visited.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "kvnode/client/kv_runs.hpp"

namespace kvnode::client::detail {

Status check_runs(const KvLayout& l, std::span<const std::uint32_t> block_ids,
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

}  // namespace kvnode::client::detail

namespace kvnode::client {

Status for_each_run(const KvLayout& layout, std::span<const std::uint32_t> block_ids,
                    std::size_t first_token, std::size_t tokens, std::size_t chunk_span_bytes,
                    const std::function<void(const KvRun&)>& each) {
  if (Status st =
          detail::check_runs(layout, block_ids, first_token, tokens, chunk_span_bytes, "chunk");
      !st) {
    return st;
  }
  detail::chunk_runs(layout, block_ids, first_token, tokens, each);
  return {};
}

Status gather(const KvLayout& layout, std::span<const std::uint32_t> block_ids,
              std::size_t first_token, std::size_t tokens, std::span<std::byte> out) {
  if (Status st = detail::check_runs(layout, block_ids, first_token, tokens, out.size(), "out");
      !st) {
    return st;
  }
  detail::chunk_runs(layout, block_ids, first_token, tokens, [&out](const KvRun& r) {
    std::memcpy(out.data() + r.chunk_offset, r.cache, r.bytes);
  });
  return {};
}

Status scatter(const KvLayout& layout, std::span<const std::uint32_t> block_ids,
               std::size_t first_token, std::size_t tokens, std::span<const std::byte> in) {
  if (Status st = detail::check_runs(layout, block_ids, first_token, tokens, in.size(), "in");
      !st) {
    return st;
  }
  detail::chunk_runs(layout, block_ids, first_token, tokens, [&in](const KvRun& r) {
    std::memcpy(r.cache, in.data() + r.chunk_offset, r.bytes);
  });
  return {};
}

}  // namespace kvnode::client
