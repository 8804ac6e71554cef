// The transfer plane: one per node. It listens at the node's peer_init_url, serves its chunk
// pool to peers and moves chunks to and from theirs. Callers name a peer by its url and give page
// pairs; the plane connects (and reconnects) on demand, coalesces adjacent pages, picks one-sided
// RMA where the transport does it natively and active messages where UCX would emulate it, and
// reports each transfer once, with per-chunk results and telemetry.
//
// Threading: every UCX call happens on the plane's own progress thread. pull()/push()/cancel()
// are thread-safe and never block on the network; completion callbacks run on the progress
// thread and must not block (hand work off, or use the future overloads).
//
// Failure model (docs/architecture.md, "Transfer plane"): a chunk is reported done only after
// its bytes are in the destination's memory. A transfer that misses its deadline, is cancelled,
// or whose peer dies resets that peer's session: every transfer in flight on it fails with the
// chunks already done marked so, and the next transfer reconnects.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/gpu/chunk_pool.hpp"
#include "kvnode/transfer/device_path.hpp"
#include "kvnode/transfer/peer_transport.hpp"

namespace kvnode::transfer {

Result<Protocol> parse_protocol(const std::string& text);  // "auto", "rma", "am"

// Same-host moves: two planes on one host (one boot, one network namespace) copy chunks
// straight between their pools instead of going through UCX: the dialling plane maps the peer's
// pool (region_share.hpp) and copies both ways itself. kAuto offers our pool to same-host peers
// (when it was allocated shareable) and maps theirs when offered; kOff does neither.
enum class SameHost { kAuto, kOff };
Result<SameHost> parse_same_host(const std::string& text);  // "auto", "off"
const char* to_string(SameHost s);

struct PlaneOptions {
  std::string host = "127.0.0.1";          // where the listener binds (the peer_init_url host)
  std::uint16_t port = 0;                  // 0: a free port, see TransferPlane::url()
  std::optional<std::string> tls;          // UCX_TLS; unset: the environment, else UCX's choice
  std::optional<std::string> net_devices;  // UCX_NET_DEVICES, e.g. "mlx5_0:1" or "lo"
  Protocol protocol = Protocol::kAuto;
  std::chrono::milliseconds default_deadline{10'000};
  // Sessions peers may hold open with this plane at once (each costs a UCX worker and a few
  // descriptors); hellos beyond it are refused. Capped at an eighth of ulimit -n.
  std::size_t max_sessions = 256;
  // How long the progress thread busy-polls after the last event before sleeping on UCX's
  // wake-up fd: latency against idle CPU.
  std::chrono::microseconds spin{200};
  // Device pools: registered with UCX directly (GPUDirect) when UCX registers CUDA memory and
  // this is kAuto (device_path.hpp); otherwise staged.
  GpuDirect gpudirect = GpuDirect::kAuto;
  // A staged device pool moves through a ring of pinned host pages: each chunk is copied with
  // cudaMemcpyAsync between its page and a slot, and the slot is what UCX sends or receives.
  // More slots, more chunks in flight.
  std::size_t staging_slots = 16;
  // Moves a host pool the same way, with memcpy in place of CUDA: the staging path's stand-in
  // for tests and diagnosis on hosts without a GPU.
  bool stage_through_host = false;
  // Same-host moves (SameHost above). The library's default keeps every move on UCX; kvnode
  // turns it on. The pool must be allocated with RegionOptions::shareable to be offered.
  SameHost same_host = SameHost::kOff;
  // Threads that copy same-host moves between host pools (0: gpu::default_copy_threads()).
  std::size_t copy_threads = 0;
  // Called on the progress thread after a peer wrote pages of our pool (push), once the bytes
  // are in place. The node marks chunks present from here, never earlier.
  std::function<void(const std::string& peer, const std::vector<gpu::PageId>& pages)> on_written;
  // Answers a peer's ask() (a few KiB at most, both ways), on the progress thread: keep it quick.
  // An error goes back to the asker with its code. Unset: asks are refused (kRefused).
  std::function<Result<std::vector<std::byte>>(const std::string& peer,
                                               const std::vector<std::byte>& request)>
      on_ask;
};

// Totals since start, for the node's metrics.
struct PlaneCounters {
  std::uint64_t transfers_ok = 0;
  std::uint64_t transfers_failed = 0;
  std::uint64_t bytes_pulled = 0;
  std::uint64_t bytes_pushed = 0;
  std::uint64_t bytes_served = 0;     // read from or written to our pool by peers (AM and RMA)
  std::uint64_t bytes_same_host = 0;  // of bytes_pulled + bytes_pushed: copied by mapping the peer
  std::uint64_t sessions_opened = 0;
  std::uint64_t sessions_reset = 0;
  std::uint64_t requests_rejected = 0;         // peers' requests refused (bad pages, bad lengths)
  std::uint64_t failures[kFailureCount] = {};  // by Failure
};

using TransferId = std::uint64_t;

class TransferPlane final : public PeerTransport {
 public:
  using Callback = std::function<void(TransferResult)>;

  // Registers the pool once, binds the listener, starts the progress thread.
  static Result<std::unique_ptr<TransferPlane>> start(const PlaneOptions& options,
                                                      const gpu::ChunkPool& pool);
  // Fails what is still in flight with kCancelled, closes sessions, joins the thread.
  ~TransferPlane();
  TransferPlane(const TransferPlane&) = delete;
  TransferPlane& operator=(const TransferPlane&) = delete;

  std::string url() const override;  // host:port where peers reach this plane

  // Reads remote pages of `peer` into local pages.
  TransferId pull(const std::string& peer, std::vector<PageCopy> pages, Callback done,
                  TransferOptions options = {});
  // Writes local pages into remote pages of `peer`; done means the bytes are in the peer's pool.
  TransferId push(const std::string& peer, std::vector<PageCopy> pages, Callback done,
                  TransferOptions options = {});
  std::future<TransferResult> pull(const std::string& peer, std::vector<PageCopy> pages,
                                   TransferOptions options = {}) override;
  std::future<TransferResult> push(const std::string& peer, std::vector<PageCopy> pages,
                                   TransferOptions options = {}) override;
  // Fails the transfer with kCancelled (and resets its session) unless it already ended.
  void cancel(TransferId id);

  // A small request/answer with the peer's node over the same session (its on_ask answers):
  // what two nodes agree on around a transfer, e.g. which pages to write. At most 8 KiB each way;
  // the error codes are PeerTransport::ask's (on_ask's own code reaches the asker).
  std::future<Result<std::vector<std::byte>>> ask(const std::string& peer,
                                                  std::vector<std::byte> request,
                                                  TransferOptions options = {}) override;

  PlaneCounters counters() const;
  // How the pool reaches UCX, decided (and logged) at start: as it is, GPUDirect or staged; and
  // the memory types UCX reported (device_path.hpp), from which it was decided.
  PoolPathChoice pool_path() const;
  std::uint64_t ucx_memory_types() const;
  // Whether same-host moves are on, and why not when they are not (the log, /health): e.g.
  // "on (pool offered; memcpy x4)" or "off (same_host off)".
  std::string same_host_status() const;

  class Impl;

 private:
  explicit TransferPlane(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvnode::transfer
