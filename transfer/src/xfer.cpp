#include "xfer.hpp"

namespace kvnode::transfer {

void Xfer::open(Plan p) {
  plan = std::move(p);
  run_state.assign(plan.runs.size(), RunState::kOpen);
  open_runs = static_cast<std::uint32_t>(plan.runs.size());
}

void Xfer::fail_run(std::uint32_t run, Failure f, const std::string& why) {
  if (failure == Failure::kNone) {
    failure = f;
    message = why;
  }
  if (is_open(run)) {
    run_state[run] = RunState::kFailed;
    --open_runs;
  }
}

void Xfer::finish_run(std::uint32_t run) {
  if (is_open(run)) {
    run_state[run] = RunState::kDone;
    --open_runs;
  }
}

void Xfer::fail_all(Failure f, const std::string& why) {
  if (failure == Failure::kNone) {
    failure = f;
    message = why;
  }
  for (std::uint32_t r = 0; r < run_state.size(); ++r) fail_run(r, f, why);
}

TransferResult Xfer::result(const PoolView& pool) const {
  TransferResult out;
  out.failure = failure;
  out.message = message;
  out.done.assign(pages.size(), 0);
  out.stats = stats;
  for (std::uint32_t r = 0; r < run_state.size(); ++r) {
    if (run_state[r] != RunState::kDone) continue;
    const Run& run = plan.runs[r];
    for (std::uint32_t k = 0; k < run.count; ++k)
      out.done[plan.chunk_order[run.first_chunk + k]] = 1;
    out.stats.chunks += run.count;
  }
  out.stats.bytes = static_cast<std::uint64_t>(out.stats.chunks) * pool.page_bytes;
  return out;
}

}  // namespace kvnode::transfer
