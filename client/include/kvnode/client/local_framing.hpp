// The local socket's framing: each message is a 4-byte little-endian length, then that many bytes
// (one msgpack map, local_protocol.hpp). A declared length over kMaxMessageBytes is refused before
// anything is allocated for it, and a frame's buffer grows with the bytes that actually arrive
// (at most twice them), so a peer that declares a large frame and stalls costs almost nothing.
// FrameReader is the incremental reader both ends use; it never reads past a frame.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kvnode::client::protocol {

inline constexpr std::size_t kFrameHeaderBytes = 4;

std::array<std::byte, kFrameHeaderBytes> frame_header(std::uint32_t length) noexcept;
std::uint32_t frame_length(std::span<const std::byte, kFrameHeaderBytes> header) noexcept;

class FrameReader {
 public:
  enum class Progress : std::uint8_t {
    kMore,      // read more into space()
    kFrame,     // a whole frame is in: take() it
    kTooLarge,  // its declared length is over kMaxMessageBytes: drop the connection
  };

  // Where the next bytes go: the rest of the header, then the rest of the body (or a first part
  // of it). Never empty while a frame is incomplete.
  std::span<std::byte> space();
  // `n` bytes were written at the start of space().
  Progress advance(std::size_t n);
  // The whole frame's body; the reader starts on the next frame.
  std::vector<std::byte> take();
  // Some bytes of a frame are in, not all of them.
  bool mid_frame() const noexcept { return header_got_ > 0; }
  std::uint32_t declared() const noexcept { return length_; }

 private:
  std::array<std::byte, kFrameHeaderBytes> header_{};
  std::size_t header_got_ = 0;
  std::uint32_t length_ = 0;
  std::vector<std::byte> body_{};
  std::size_t body_got_ = 0;
};

}  // namespace kvnode::client::protocol
