// Shared checks of the fuzz targets: a decoded value must re-encode to bytes that decode back to
// the same value, and its JSON view must build and serialize. Failures print and __builtin_trap().
#pragma once

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "kvnode/wire/codec.hpp"
#include "kvnode/wire/json.hpp"

namespace kvnode::fuzz {

[[noreturn]] inline void fail(const char* what, std::string_view detail, std::string_view bytes) {
  std::fprintf(stderr, "\n== fuzz invariant failed: %s\n   %.*s\n   re-encoded (%zu bytes): ", what,
               static_cast<int>(detail.size()), detail.data(), bytes.size());
  for (unsigned char c : bytes) std::fprintf(stderr, "%02x", c);
  std::fprintf(stderr, "\n");
  __builtin_trap();
}

// `decode_again` is the decoder that produced `decoded` (decode, decode_kv_op_event, ...).
template <class T, class Decode>
void check_round_trip(const Result<T>& decoded, Decode decode_again) {
  if (!decoded.ok()) {
    if (decoded.error().message.empty()) fail("error without a message", "", "");
    return;
  }
  const T& x = *decoded;
  std::string bytes;
  wire::encode(x, bytes);
  const Result<T> again = decode_again(std::string_view(bytes));
  if (!again.ok()) fail("encode(x) does not decode", again.error().message, bytes);
  if (!(*again == x)) {
    // A NaN makes x != x; then the canonical bytes must still agree.
    std::string bytes_again;
    wire::encode(*again, bytes_again);
    if (x == x || bytes_again != bytes) fail("decode(encode(x)) != x", "", bytes);
  }
  try {
    const wire::Json j = wire::to_builtins(x);
    (void)j.dump();  // what kvctl prints and the HTTP API serves
  } catch (const std::exception& e) {
    fail("to_builtins(x) or its dump() threw", e.what(), bytes);
  }
}

// Runs every public decoder on `payload` and checks each success.
inline void check_all_decoders(std::string_view payload) {
  check_round_trip(wire::decode(payload), [](std::string_view b) { return wire::decode(b); });
  check_round_trip(wire::decode_kv_op_event(payload),
                   [](std::string_view b) { return wire::decode_kv_op_event(b); });
  check_round_trip(wire::decode_command(payload),
                   [](std::string_view b) { return wire::decode_command(b); });
}

}  // namespace kvnode::fuzz
