// eventually(condition): polls `condition` every `poll` until it holds (true) or `patience` runs
// out (false), for tests that wait on another thread or process. The one copy every suite uses;
// a suite with its own patience wraps it in a line.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace kvnode::test {

inline bool eventually(const std::function<bool()>& condition,
                       std::chrono::steady_clock::duration patience = std::chrono::seconds(15),
                       std::chrono::steady_clock::duration poll = std::chrono::milliseconds(5)) {
  const auto give_up = std::chrono::steady_clock::now() + patience;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(poll);
  }
  return true;
}

}  // namespace kvnode::test
