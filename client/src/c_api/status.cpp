// The C API's statuses and errors: kvnode_status_string, and filling a caller's kvnode_error_t.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "c_api/c_api.hpp"

namespace kvnode::c_api {

void copy_cut(char* dst, std::size_t capacity, std::string_view text) noexcept {
  if (dst == nullptr || capacity == 0) return;
  std::size_t n = std::min(text.size(), capacity - 1);
  // Back off to a character boundary: bytes 10xxxxxx continue a UTF-8 sequence.
  const auto continues = [&](std::size_t i) {
    return (static_cast<unsigned char>(text[i]) & 0xC0u) == 0x80u;
  };
  if (n < text.size())
    while (n > 0 && continues(n)) --n;
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

kvnode_status_t ok(kvnode_error_t* err) noexcept {
  if (err != nullptr) {
    err->status = KVNODE_OK;
    err->message[0] = '\0';
  }
  return KVNODE_OK;
}

kvnode_status_t fail(ErrorCode code, std::string_view message, kvnode_error_t* err) noexcept {
  const kvnode_status_t status = to_status(code);
  if (err != nullptr) {
    err->status = status;
    copy_cut(err->message, sizeof err->message, message);
  }
  return status;
}

kvnode_status_t fail(const Error& error, kvnode_error_t* err) noexcept {
  return fail(error.code, error.message, err);
}

kvnode_status_t check_fields(std::uint64_t mask, std::uint64_t known, std::string_view function,
                             kvnode_error_t* err, std::string_view what) {
  const std::uint64_t unknown = mask & ~known;
  if (unknown == 0) return KVNODE_OK;
  char bits[32];
  std::snprintf(bits, sizeof bits, "0x%llx", static_cast<unsigned long long>(unknown));
  return invalid(std::string(function) + ": " + std::string(what) + "->field_mask: bits " + bits +
                     " name no field of this library (KVNODE_CLIENT_API_VERSION " +
                     std::to_string(KVNODE_CLIENT_API_VERSION) + ")",
                 err);
}

}  // namespace kvnode::c_api

extern "C" const char* kvnode_status_string(kvnode_status_t status) {
  switch (status) {
    case KVNODE_OK:
      return "ok";
    case KVNODE_ERR_INVALID:
      return "invalid";
    case KVNODE_ERR_NOT_FOUND:
      return "not_found";
    case KVNODE_ERR_NO_ROOM:
      return "no_room";
    case KVNODE_ERR_FROZEN:
      return "frozen";
    case KVNODE_ERR_DEADLINE:
      return "deadline";
    case KVNODE_ERR_PEER_LOST:
      return "peer_lost";
    case KVNODE_ERR_REFUSED:
      return "refused";
    case KVNODE_ERR_IO:
      return "io";
    case KVNODE_ERR_INTERNAL:
      return "internal";
  }
  return "unknown";
}
