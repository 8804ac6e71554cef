// JSON views of wire messages: to_builtins() gives msgspec's `to_builtins(msg, str_keys=True)`
// form ("type" included, enums by value, tuples as arrays, integer dict keys as strings), which
// kvctl prints and the HTTP API serves. json_to_msgpack() is the transcoder behind decoding JSON
// payloads: JSON text in, equivalent msgpack out, with nesting bounded.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "kvnode/common/result.hpp"
#include "kvnode/wire/messages.hpp"

namespace kvnode::wire {

using Json = nlohmann::ordered_json;

Json to_builtins(const Msg& msg);
Json to_builtins(const KVOpEvent& event);
Json to_builtins(const AnyCommand& command);

Result<std::string> json_to_msgpack(std::string_view json);

// What a payload is decoded as: the message union, or one nested type on its own (kvctl's --as
// and the conformance vectors' decode_as use these).
enum class Root { kMsg, kKVOpEvent, kAnyCommand };

// Decodes a payload (msgpack, or JSON when it starts with '{') as `root` and returns its builtins.
Result<Json> decode_to_builtins(std::string_view payload, Root root = Root::kMsg);
// Decodes a payload as `root` and returns its canonical msgpack encoding.
Result<std::string> reencode(std::string_view payload, Root root = Root::kMsg);

}  // namespace kvnode::wire
