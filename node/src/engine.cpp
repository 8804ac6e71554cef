#include "kvnode/node/engine.hpp"

#include <cstring>

namespace kvnode::node {

Engine::Engine(ChunkStore& store, EngineOptions options) : store_(store), options_(options) {}

Result<std::vector<ChunkHash>> Engine::hashes(std::span<const std::int64_t> tokens) const {
  Result<std::vector<wire::ChunkHash>> wide = keys::chunk_hashes(tokens, options_.hashing);
  if (!wide) return wide.error();
  std::vector<ChunkHash> out;
  out.reserve(wide->size());
  for (const wire::ChunkHash& h : *wide) {
    const std::optional<std::int64_t> v = h.as_int64();
    if (!v) return make_error(ErrorCode::kInvalid, "a chunk hash does not fit 64 bits");
    out.push_back(*v);
  }
  return out;
}

std::size_t Engine::lookup_tokens(std::span<const std::int64_t> tokens, const std::string& pin_id) {
  Result<std::vector<ChunkHash>> h = hashes(tokens);
  if (!h) return 0;
  const std::size_t n = store_.leading(*h, pin_id);
  return n == 0 ? 0 : keys::chunk_end_token(n - 1, tokens.size(), options_.hashing.chunk_size);
}

Status Engine::put(ChunkHash hash, std::span<const std::byte> bytes, std::uint64_t evict_up_to) {
  gpu::ChunkPool& pool = store_.pool();
  if (bytes.size() != pool.page_bytes())
    return make_error(ErrorCode::kInvalid, "a chunk is " + std::to_string(pool.page_bytes()) +
                                               " bytes, got " + std::to_string(bytes.size()));
  Result<gpu::PageId> page = store_.reserve(hash, evict_up_to);
  if (!page) return page.error();
  if (Status s = pool.write(*page, bytes); !s) {  // a device pool: cudaMemcpy
    store_.abort(hash);
    return s;
  }
  return store_.commit(hash);
}

Result<std::size_t> Engine::get(ChunkHash hash, std::span<std::byte> out) {
  gpu::ChunkPool& pool = store_.pool();
  std::optional<Lease> lease = store_.lease(hash);
  if (!lease) return make_error(ErrorCode::kNotFound, "chunk not found");
  if (out.size() < pool.page_bytes())
    return make_error(ErrorCode::kInvalid, "the buffer holds " + std::to_string(out.size()) +
                                               " bytes, a chunk " +
                                               std::to_string(pool.page_bytes()));
  if (Status s = pool.read(lease->page(), out.first(pool.page_bytes())); !s) return s.error();
  return pool.page_bytes();
}

Result<std::size_t> Engine::clear() {
  return store_.clear();
}

bool Engine::healthy() const {
  const StoreCounters c = store_.counters();
  return c.chunks + c.reserved <= c.capacity;
}

}  // namespace kvnode::node
