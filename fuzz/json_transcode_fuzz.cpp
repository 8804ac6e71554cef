// fuzz_json_transcode: arbitrary text into json_to_msgpack(). Its output must be exactly one
// well-formed msgpack object (checked with msgpack-cxx), and whatever the decoders accept from it
// must round-trip through encode() like in fuzz_wire_decode.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <msgpack.hpp>
#include <string>
#include <string_view>

#include "roundtrip.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  const kvnode::Result<std::string> packed = kvnode::wire::json_to_msgpack(json);
  if (!packed.ok()) {
    if (packed.error().message.empty()) kvnode::fuzz::fail("error without a message", "", "");
    return 0;
  }
  const std::string& bytes = *packed;
  try {
    std::size_t offset = 0;
    const msgpack::object_handle handle = msgpack::unpack(bytes.data(), bytes.size(), offset);
    (void)handle;
    if (offset != bytes.size())
      kvnode::fuzz::fail("json_to_msgpack left trailing bytes", "", bytes);
  } catch (const std::exception& e) {
    kvnode::fuzz::fail("json_to_msgpack output is not msgpack", e.what(), bytes);
  }
  kvnode::fuzz::check_all_decoders(bytes);
  return 0;
}
