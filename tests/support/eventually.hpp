// eventually(condition): polls `condition` every 5 ms until it holds (true) or `patience` runs out
// (false), for tests that wait on another thread or process.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace kvnode::test {

inline bool eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds patience = std::chrono::seconds(10)) {
  const auto give_up = std::chrono::steady_clock::now() + patience;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace kvnode::test
