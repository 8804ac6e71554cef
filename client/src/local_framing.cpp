#include "kvnode/client/local_framing.hpp"

#include <algorithm>
#include <cassert>

#include "kvnode/client/local_protocol.hpp"

namespace kvnode::client::protocol {
namespace {

constexpr std::size_t kFirstBodyBytes = 64 << 10;  // a body's buffer starts here, then doubles

}  // namespace

std::array<std::byte, kFrameHeaderBytes> frame_header(std::uint32_t length) noexcept {
  std::array<std::byte, kFrameHeaderBytes> out{};
  for (std::size_t i = 0; i < kFrameHeaderBytes; ++i)
    out[i] = static_cast<std::byte>((length >> (8 * i)) & 0xff);
  return out;
}

std::uint32_t frame_length(std::span<const std::byte, kFrameHeaderBytes> header) noexcept {
  std::uint32_t length = 0;
  for (std::size_t i = 0; i < kFrameHeaderBytes; ++i)
    length |= static_cast<std::uint32_t>(header[i]) << (8 * i);
  return length;
}

std::span<std::byte> FrameReader::space() {
  if (header_got_ < kFrameHeaderBytes) return std::span(header_).subspan(header_got_);
  if (body_got_ == body_.size()) {
    const std::size_t grown = std::max(kFirstBodyBytes, body_.size() * 2);
    body_.resize(std::min<std::size_t>(length_, grown));
  }
  return std::span(body_).subspan(body_got_);
}

FrameReader::Progress FrameReader::advance(std::size_t n) {
  if (header_got_ < kFrameHeaderBytes) {
    header_got_ += n;
    assert(header_got_ <= kFrameHeaderBytes);
    if (header_got_ < kFrameHeaderBytes) return Progress::kMore;
    length_ = frame_length(header_);
    if (length_ > kMaxMessageBytes) return Progress::kTooLarge;
    return length_ == 0 ? Progress::kFrame : Progress::kMore;
  }
  body_got_ += n;
  assert(body_got_ <= body_.size());
  return body_got_ == length_ ? Progress::kFrame : Progress::kMore;
}

std::vector<std::byte> FrameReader::take() {
  std::vector<std::byte> out = std::move(body_);
  out.resize(body_got_);
  header_got_ = 0;
  length_ = 0;
  body_ = {};
  body_got_ = 0;
  return out;
}

}  // namespace kvnode::client::protocol
