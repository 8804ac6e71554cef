// Errors as values at module boundaries: Result<T> holds a T or an Error, a code a program acts
// on next to a message a person acts on (as UCX pairs ucs_status_t with its string). Callers
// branch on the code, never on the text. A stand-in for std::expected, which the project's
// compilers (g++ 12 in C++20 mode, clang 14) do not offer.
#pragma once

#include <cassert>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace kvnode {

// What went wrong, for the caller's branch. kInvalid is the default: most errors are a request,
// a file or an argument that is wrong, and nobody branches on them.
enum class ErrorCode : std::uint8_t {
  kInvalid,   // the request, input or configuration is wrong; asking again will not help
  kNotFound,  // what was named does not exist (a chunk, a hold, a worker)
  kNoRoom,    // no space left (every page pinned, leased or being written; a cap reached)
  kFrozen,    // a full sync runs: stores and removals wait until it ends; ask again shortly
  kDeadline,  // no answer within the time allowed
  kPeerLost,  // the other end died, refused the connection or closed it
  kRefused,   // understood and declined (a move to itself, an operation not supported)
  kIo,        // the operating system failed a call (socket, file, memory)
  kInternal,  // a bug: a state that should not happen
};

struct Error {
  Error() = default;
  explicit Error(std::string m) : message(std::move(m)) {}
  Error(ErrorCode c, std::string m) : code(c), message(std::move(m)) {}
  ErrorCode code = ErrorCode::kInvalid;
  std::string message;
};

inline const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalid:
      return "invalid";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kNoRoom:
      return "no_room";
    case ErrorCode::kFrozen:
      return "frozen";
    case ErrorCode::kDeadline:
      return "deadline";
    case ErrorCode::kPeerLost:
      return "peer_lost";
    case ErrorCode::kRefused:
      return "refused";
    case ErrorCode::kIo:
      return "io";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  // By value: `for (x : f().value())` would otherwise iterate a destroyed temporary.
  T value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const& {
    assert(!ok());
    return std::get<1>(v_);
  }
  Error&& error() && {
    assert(!ok());
    return std::get<1>(std::move(v_));
  }

 private:
  std::variant<T, Error> v_;
};

// Success or an Error, for operations that produce nothing.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), failed_(true) {}  // NOLINT: implicit by design

  bool ok() const noexcept { return !failed_; }
  explicit operator bool() const noexcept { return ok(); }
  const Error& error() const {
    assert(failed_);
    return error_;
  }

 private:
  Error error_;
  bool failed_ = false;
};

inline Error make_error(std::string message) {
  return Error{std::move(message)};
}
inline Error make_error(ErrorCode code, std::string message) {
  return Error{code, std::move(message)};
}
// The same error with context in front of its message; the code is kept.
inline Error wrap_error(std::string context, Error error) {
  error.message = std::move(context) + error.message;
  return error;
}

}  // namespace kvnode
