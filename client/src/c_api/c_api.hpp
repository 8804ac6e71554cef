// What the C API's files share: the opaque handles' definitions, and how a call answers: a
// kvnode_status_t, with the code and message copied into the caller's kvnode_error_t (cut to fit,
// NUL-terminated). guarded() runs a call's body so that no exception crosses the C boundary.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <string_view>
#include <utility>

#include "c_api/export.hpp"
#include "c_api/status_map.hpp"
#include "kvnode/client/kv_memory.hpp"
#include "kvnode/client/local_client.hpp"
#include "kvnode/common/result.hpp"

// A connection. The KV caches registered through it hold a weak reference, so closing the client
// first (which ends its registrations on the node) leaves them safe to call and to close.
struct kvnode_client {
  std::shared_ptr<kvnode::client::LocalClient> client;
};

struct kvnode_kv_cache {
  std::weak_ptr<kvnode::client::LocalClient> client;
  std::uint64_t id = 0;  // LocalClient::register_kv's answer
};

struct kvnode_host_memory {
  explicit kvnode_host_memory(kvnode::client::HostKvMemory m) : memory(std::move(m)) {}
  kvnode::client::HostKvMemory memory;
};

namespace kvnode::c_api {

// Copies `text` into dst[0, capacity) NUL-terminated, cut to fit (never inside a UTF-8 sequence).
void copy_cut(char* dst, std::size_t capacity, std::string_view text) noexcept;

// Fills `err` when it is not NULL and answers the status.
kvnode_status_t ok(kvnode_error_t* err) noexcept;
kvnode_status_t fail(const Error& error, kvnode_error_t* err) noexcept;
kvnode_status_t fail(ErrorCode code, std::string_view message, kvnode_error_t* err) noexcept;
inline kvnode_status_t invalid(std::string_view message, kvnode_error_t* err) noexcept {
  return fail(ErrorCode::kInvalid, message, err);
}

// KVNODE_ERR_INVALID ("<function>: <what>->field_mask: ...") when `mask` has bits outside `known`
// (fields of a newer header than this library's: their values would be ignored, or an output
// struct's would stay unwritten, so the call is refused); else KVNODE_OK.
kvnode_status_t check_fields(std::uint64_t mask, std::uint64_t known, std::string_view function,
                             kvnode_error_t* err, std::string_view what = "params");

// Runs `body` (which answers a kvnode_status_t); an exception becomes KVNODE_ERR_NO_ROOM (out of
// memory) or KVNODE_ERR_INTERNAL with its text.
template <class Body>
kvnode_status_t guarded(kvnode_error_t* err, Body&& body) noexcept {
  try {
    return std::forward<Body>(body)();
  } catch (const std::bad_alloc&) {
    return fail(ErrorCode::kNoRoom, "out of memory", err);
  } catch (const std::exception& e) {
    return fail(ErrorCode::kInternal, e.what(), err);
  } catch (...) {
    return fail(ErrorCode::kInternal, "an unknown exception", err);
  }
}

}  // namespace kvnode::c_api
