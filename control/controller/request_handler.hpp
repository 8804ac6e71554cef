// What the controller does with one frame from each socket, apart from the sockets themselves:
// decode, apply to the registry under its lock, build the reply. Errors never escape: a bad
// frame is counted and answered (ROUTER) or skipped (PULL), so ingest never stops (D1).
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "kvnode/controller/fanout.hpp"
#include "kvnode/controller/guarded.hpp"
#include "kvnode/controller/metrics.hpp"
#include "kvnode/controller/orchestrator.hpp"
#include "kvnode/controller/registry.hpp"

namespace kvnode::controller {

enum class RouterKind { kReply, kHeartbeat };

// How heartbeat_url is advertised (protocol reference §3.2); empty host = no heartbeat socket.
struct HeartbeatAdvert {
  std::string advertise_host;  // controller_advertise_host
  std::string bind_host;       // controller_host
  std::string own_ip;          // the controller's outbound IP, for wildcard binds
  int port = -1;
  // The heartbeat_url for a worker registering from worker_ip; nullopt without the socket.
  std::optional<std::string> url_for(std::string_view worker_ip) const;
};

class RequestHandler {
 public:
  using Clock = std::function<double()>;  // epoch seconds
  // Runs orchestrator messages that arrive on PULL away from the ingest thread.
  using OrchestratorSink = std::function<void(wire::Msg)>;

  RequestHandler(Guarded<Registry>& registry, FanOut& fanout, Metrics& metrics,
                 HeartbeatAdvert advert, Clock clock, OrchestratorSink orchestrator_sink);

  // One ROUTER payload -> the msgpack reply to send back.
  std::string on_router(std::string_view payload, RouterKind kind);
  // One PULL frame (each frame of a multipart message is one message).
  void on_pull(std::string_view frame);

 private:
  static constexpr std::size_t kApplySlice = 64;

  void on_pull_msg(wire::Msg msg);
  template <class Count>
  void apply_in_slices(const wire::BatchedKVOperationMsg& m, Count&& count);
  void warn_bad_frame(std::string_view socket, std::string_view what);
  void warn_limited(std::string_view text);  // at most one warning a second, counting the rest

  Guarded<Registry>& registry_;
  FanOut& fanout_;
  Metrics& metrics_;
  HeartbeatAdvert advert_;
  Clock clock_;
  OrchestratorSink orchestrator_sink_;
  std::string reply_buf_;
  double last_warning_ = 0;  // warnings about pulled frames are rate limited to one a second
  std::uint64_t suppressed_warnings_ = 0;
};

}  // namespace kvnode::controller
