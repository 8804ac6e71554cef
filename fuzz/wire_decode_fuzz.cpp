// fuzz_wire_decode: arbitrary bytes into the wire decoders (msgpack, or JSON when the input starts
// with '{'); each success must round-trip through encode() and render through to_builtins().
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "roundtrip.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kvnode::fuzz::check_all_decoders(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
