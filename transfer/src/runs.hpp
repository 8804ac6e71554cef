// Coalescing: a transfer's page pairs become runs, each one contiguous span on both sides, so a
// batch of adjacent chunks costs one UCX operation instead of one per chunk (the descriptor count
// is what limits small transfers in the field). Pure functions, unit-tested.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/transfer/plane.hpp"

namespace kvnode::transfer {

struct Run {
  gpu::PageId local = 0;   // first page in our pool
  gpu::PageId remote = 0;  // first page in the peer's pool
  std::uint32_t count = 0;
  std::uint32_t first_chunk = 0;  // index into Plan::chunk_order of this run's first chunk
};

struct Plan {
  std::vector<Run> runs;
  std::vector<std::uint32_t> chunk_order;  // request indices, in run order
};

// Sorts by remote page and merges pairs adjacent on both sides. Refuses an empty request, a page
// outside either pool, and a page written twice (the local side of a pull, the remote of a push).
// `max_run` caps a run's pages (1 where chunks go through a one-page staging slot).
Result<Plan> plan_runs(const std::vector<PageCopy>& pages, std::uint32_t local_pages,
                       std::uint32_t remote_pages, bool pull, std::uint32_t max_run = UINT32_MAX);

}  // namespace kvnode::transfer
