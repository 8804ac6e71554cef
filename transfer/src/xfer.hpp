// A transfer this plane started, from submit() to its one report: the page pairs asked for, the
// runs they coalesced into (runs.hpp), where each run stands, and the outcome. Owned by the
// plane's command queue, then by the initiator session that carries it; private to transfer/src.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/transfer/plane.hpp"
#include "runs.hpp"

namespace kvnode::transfer {

using Clock = std::chrono::steady_clock;

// Our chunk pool as the sessions see it: page ids to addresses.
struct PoolView {
  std::byte* base = nullptr;
  std::size_t page_bytes = 0;
  std::uint32_t pages = 0;
  std::byte* page(gpu::PageId p) const { return base + static_cast<std::size_t>(p) * page_bytes; }
};

// Where one run of a transfer stands. A run leaves kOpen once, to kDone (its bytes are in
// place) or kFailed; a late completion for a run no longer open is ignored.
enum class RunState : std::uint8_t { kOpen, kDone, kFailed };

struct Xfer {
  TransferId id = 0;
  bool pull = true;
  std::string peer;
  std::vector<PageCopy> pages;
  TransferPlane::Callback callback;
  Clock::time_point submitted, posted, deadline;
  Plan plan;
  std::vector<RunState> run_state;  // per plan.runs
  std::uint32_t open_runs = 0;
  bool notified = false;   // the peer was told what RMA did to its pages
  bool same_host = false;  // copied through the peer's pool mapped here
  Failure failure = Failure::kNone;
  std::string message;
  TransferStats stats;

  // All runs open, once the plan is made.
  void open(Plan p);
  bool is_open(std::uint32_t run) const {
    return run < run_state.size() && run_state[run] == RunState::kOpen;
  }
  void fail_run(std::uint32_t run, Failure f, const std::string& why);
  void finish_run(std::uint32_t run);
  void fail_all(Failure f, const std::string& why);
  bool finished() const { return open_runs == 0; }
  TransferResult result(const PoolView& pool) const;
};

// A request to the peer's node, waiting for its answer.
struct PendingAsk {
  std::uint64_t id = 0;
  std::vector<std::byte> body;
  Clock::time_point deadline;
  std::function<void(Result<std::vector<std::byte>>)> done;
};

}  // namespace kvnode::transfer
