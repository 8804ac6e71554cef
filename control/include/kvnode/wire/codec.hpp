// The wire codec: LMCache's messages as msgspec encodes and decodes them, byte for byte.
// Encoding writes one msgpack map: "type" first, every field in declaration order, defaults
// included, smallest integer forms. Decoding accepts what msgspec accepts (any key order, unknown
// keys, missing defaulted fields, non-canonical widths, last duplicate wins) and rejects the rest
// with msgspec's error text and path, e.g. "Expected `int`, got `str` - at `$.operations[1].key`".
// A payload whose first byte is '{' is JSON and decodes to the same types by the same rules.
// Hostile input is safe: reservations are bounded by the bytes left over the element's smallest
// wire size (none for schemaless nested values), repeated keys are found by sorting, nesting is
// bounded, and running out of memory is an error, not a crash.
#pragma once

#include <string>
#include <string_view>

#include "kvnode/common/result.hpp"
#include "kvnode/wire/messages.hpp"

namespace kvnode::wire {

// Appends the msgpack encoding to `out` (reuse one buffer to avoid allocations).
void encode(const Msg& msg, std::string& out);
void encode(const KVOpEvent& event, std::string& out);
void encode(const AnyCommand& command, std::string& out);
std::string encode(const Msg& msg);

// Decodes one message: msgpack, or JSON when the payload starts with '{'.
Result<Msg> decode(std::string_view payload);
Result<KVOpEvent> decode_kv_op_event(std::string_view payload);
Result<AnyCommand> decode_command(std::string_view payload);

// The class text LMCache puts in its "Unknown message type: ..." errors.
std::string python_class_text(std::string_view tag);

}  // namespace kvnode::wire
