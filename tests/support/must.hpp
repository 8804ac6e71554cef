// must(result): the value, or an exception carrying the error's message, for test set-up steps
// whose failure should fail the test with the reason rather than crash it.
#pragma once

#include <stdexcept>
#include <utility>

#include "kvnode/common/result.hpp"

namespace kvnode::test {

template <class T>
T must(Result<T> r) {
  if (!r) throw std::runtime_error(r.error().message);
  return std::move(r).value();
}

}  // namespace kvnode::test
