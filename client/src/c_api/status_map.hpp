// ErrorCode to kvnode_status_t, one to one. Header-only so the tests check every code against the
// header's values and names.
#pragma once

#include "c_api/export.hpp"
#include "kvnode/common/result.hpp"

namespace kvnode::c_api {

constexpr kvnode_status_t to_status(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalid:
      return KVNODE_ERR_INVALID;
    case ErrorCode::kNotFound:
      return KVNODE_ERR_NOT_FOUND;
    case ErrorCode::kNoRoom:
      return KVNODE_ERR_NO_ROOM;
    case ErrorCode::kFrozen:
      return KVNODE_ERR_FROZEN;
    case ErrorCode::kDeadline:
      return KVNODE_ERR_DEADLINE;
    case ErrorCode::kPeerLost:
      return KVNODE_ERR_PEER_LOST;
    case ErrorCode::kRefused:
      return KVNODE_ERR_REFUSED;
    case ErrorCode::kIo:
      return KVNODE_ERR_IO;
    case ErrorCode::kInternal:
      return KVNODE_ERR_INTERNAL;
  }
  return KVNODE_ERR_INTERNAL;  // a code newer than this table: a bug, said as one
}

}  // namespace kvnode::c_api
