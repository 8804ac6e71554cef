// Bytes from a TCP peer into zmtp::Reader, delivered in pieces as zmtp::Server delivers them (the
// first byte picks the piece size and our socket type, the second the frame limit). Traps when a
// frame passes the limit, more is consumed than was given, or what is left over is a unit the
// reader could have taken (the server would then wait forever for bytes it already holds).
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvnode/zmtp/reader.hpp"

namespace {

struct Sink final : kvnode::zmtp::FrameSink {
  explicit Sink(std::uint64_t max) : max_frame(max) {}
  void frame(std::string_view body, bool) override {
    if (body.size() > max_frame) __builtin_trap();
    bytes += body.size();
  }
  std::uint64_t max_frame;
  std::size_t bytes = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t step = 1 + data[0] % 64;
  const std::uint64_t max_frame = std::uint64_t{data[1]} * 16;
  const std::string input(reinterpret_cast<const char*>(data + 2), size - 2);
  const auto type =
      data[0] & 0x80 ? kvnode::zmtp::SocketType::kRouter : kvnode::zmtp::SocketType::kPull;
  kvnode::zmtp::Reader reader(type, max_frame);
  Sink sink(max_frame);
  std::string held, reply;
  for (std::size_t at = 0; at < input.size(); at += step) {
    held += input.substr(at, step);
    const auto used = reader.consume(held, reply, sink);
    if (!used) return 0;  // the connection would be closed: nothing more to check
    if (*used > held.size()) __builtin_trap();
    held.erase(0, *used);
    if (!held.empty() && reader.wanted(held) <= held.size()) __builtin_trap();
  }
  if (sink.bytes > input.size()) __builtin_trap();
  return 0;
}
