#include "control_handler.hpp"

#include <string>

namespace kvnode::node {
namespace {

wire::ErrorMsg refuse(const std::string& what) {
  return wire::ErrorMsg{"kvnode: " + what};
}

}  // namespace

wire::Msg ControlHandler::operator()(const wire::Msg& request) const {
  const std::string& location = engine_.location();
  if (const auto* m = std::get_if<wire::ClearWorkerMsg>(&request)) {
    if (m->location != location) return wire::ClearWorkerRetMsg{0};
    Result<std::size_t> chunks = engine_.clear();
    if (!chunks) return refuse("clear refused: " + chunks.error().message);
    return wire::ClearWorkerRetMsg{static_cast<std::int64_t>(*chunks * engine_.chunk_size())};
  }
  if (const auto* m = std::get_if<wire::PinWorkerMsg>(&request)) {
    if (m->location != location) return wire::PinWorkerRetMsg{0};
    return wire::PinWorkerRetMsg{
        static_cast<std::int64_t>(engine_.lookup_tokens(m->tokens, m->worker_event_id))};
  }
  if (std::holds_alternative<wire::HealthWorkerMsg>(request))
    return wire::HealthWorkerRetMsg{engine_.healthy() ? 0 : -1};
  if (const auto* m = std::get_if<wire::CompressWorkerMsg>(&request))
    return refuse("compression ('" + m->method + "') is not supported; chunks stay as stored");
  if (const auto* m = std::get_if<wire::DecompressWorkerMsg>(&request))
    return refuse("decompression ('" + m->method +
                  "') is not supported; chunks are never compressed");
  if (const auto* m = std::get_if<wire::MoveWorkerMsg>(&request)) {
    if (!moves_) return refuse("this node has no transfer plane to move chunks with");
    return moves_->on_move(*m);
  }
  if (std::holds_alternative<wire::CheckFinishWorkerMsg>(request))
    return refuse("moves finish before their reply; there is nothing to check");
  return refuse("unexpected request");
}

}  // namespace kvnode::node
