// The node's staging region (POSIX shared memory, one chunk per slot) mapped into the client's
// process: the client writes a put's chunks into the slots the node reserved, and reads a get's
// chunks from the slots it leased. Every offset the node answers is checked against the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kvnode/common/result.hpp"

namespace kvnode::client::detail {

class SharedStaging {
 public:
  static Result<SharedStaging> open(const std::string& name, std::size_t bytes);
  SharedStaging(SharedStaging&& o) noexcept;
  SharedStaging& operator=(SharedStaging&&) = delete;
  SharedStaging(const SharedStaging&) = delete;
  SharedStaging& operator=(const SharedStaging&) = delete;
  ~SharedStaging();

  // The `n` bytes at a node-given offset; nullptr when they are not all inside the mapping.
  std::byte* at(std::int64_t offset, std::size_t n) const;

 private:
  SharedStaging(std::byte* base, std::size_t bytes) : base_(base), bytes_(bytes) {}
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace kvnode::client::detail
