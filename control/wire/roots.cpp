// One dispatch over the decodable roots, shared by kvctl and the tests.
#include "kvnode/wire/codec.hpp"
#include "kvnode/wire/json.hpp"

namespace kvnode::wire {
namespace {

// Calls fn with the decoded value of the requested root type, or returns the decode error.
template <class R, class Fn>
Result<R> with_root(std::string_view payload, Root root, Fn fn) {
  auto apply = [&](auto decoded) -> Result<R> {
    if (!decoded) return std::move(decoded).error();
    return fn(*decoded);
  };
  switch (root) {
    case Root::kKVOpEvent:
      return apply(decode_kv_op_event(payload));
    case Root::kAnyCommand:
      return apply(decode_command(payload));
    case Root::kMsg:
      break;
  }
  return apply(decode(payload));
}

}  // namespace

Result<Json> decode_to_builtins(std::string_view payload, Root root) {
  return with_root<Json>(payload, root, [](const auto& v) { return to_builtins(v); });
}

Result<std::string> reencode(std::string_view payload, Root root) {
  return with_root<std::string>(payload, root, [](const auto& v) {
    std::string out;
    encode(v, out);
    return out;
  });
}

}  // namespace kvnode::wire
