#include "kvnode/wire/codec.hpp"

#include "decoder.hpp"
#include "json_transcoder.hpp"

namespace kvnode::wire {
namespace {

using detail::DecodeContext;
using detail::Item;
using detail::PathNode;

template <class T>
Result<T> decode_root(std::string_view data, bool from_json) {
  DecodeContext ctx(data, from_json);
  T out{};
  Item it;
  bool ok = false;
  try {
    ok = ctx.next(it) && detail::decode_item(ctx, it, out, PathNode{});
  } catch (
      const std::bad_alloc&) {  // the input is bounded, but memory may be short: answer, don't die
    ok = ctx.fail_plain("out of memory while decoding a " + std::to_string(data.size()) +
                        "-byte message");
  }
  if (ok && !ctx.reader.at_end()) {
    ok = ctx.fail_plain("MessagePack data is malformed: trailing characters (byte " +
                        std::to_string(ctx.reader.offset()) + ")");
  }
  if (!ok) return Error{std::move(ctx.error)};
  return out;
}

template <class T>
Result<T> decode_payload(std::string_view payload) {
  if (!payload.empty() && payload.front() == '{') {
    auto msgpack = json_to_msgpack(payload);
    if (!msgpack) return std::move(msgpack).error();
    return decode_root<T>(*msgpack, /*from_json=*/true);
  }
  return decode_root<T>(payload, /*from_json=*/false);
}

}  // namespace

Result<Msg> decode(std::string_view payload) {
  return decode_payload<Msg>(payload);
}
Result<KVOpEvent> decode_kv_op_event(std::string_view payload) {
  return decode_payload<KVOpEvent>(payload);
}
Result<AnyCommand> decode_command(std::string_view payload) {
  return decode_payload<AnyCommand>(payload);
}

}  // namespace kvnode::wire
