// kvcontroller as a library: binds the PULL, reply ROUTER, heartbeat ROUTER and HTTP sockets of
// a ControllerConfig and serves them until stopped. Each socket has its own thread, so a burst
// of admit/evict ingest on PULL never delays a P2P lookup or heartbeat on the ROUTERs (D6); the
// registry is shared under a reader/writer lock taken per message. A housekeeping thread runs
// the reaper and the full-sync timeout.
#pragma once

#include <cstdint>
#include <memory>

#include "kvnode/common/result.hpp"
#include "kvnode/controller/config.hpp"

namespace kvnode::controller {

// The largest frame any controller socket accepts. A 1000-op batch is ~43 KB, a full-sync batch
// of 2000 keys ~20 KB, a 1 M-token LookupMsg ~5 MB; a bigger frame is hostile, and ZMQ drops the
// connection that sent it before anything is allocated for it.
inline constexpr std::int64_t kMaxMessageBytes = std::int64_t{64} << 20;

struct BoundPorts {
  int pull = -1;
  int reply = -1;
  int heartbeat = -1;  // -1: no heartbeat socket
  int http = -1;
  int legacy_pull = -1;  // --monitor-port, -1 when not configured
};

class Controller {
 public:
  static Result<std::unique_ptr<Controller>> start(const ControllerConfig& config);
  ~Controller();  // stop()
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // Stops every thread and closes every socket; idempotent.
  void stop();
  const BoundPorts& ports() const;

  struct Impl;  // defined in controller.cpp; only start() can make one
  explicit Controller(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvnode::controller
