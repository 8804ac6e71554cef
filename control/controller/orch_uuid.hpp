// Random version-4 UUIDs for event ids ("Clear" + uuid4, "HealthWorker0" + uuid4, ...), as
// LMCache makes them with uuid.uuid4(). Each owner keeps its own generator: no global state.
#pragma once

#include <cstdint>
#include <mutex>
#include <random>
#include <string>

namespace kvnode::controller {

class Uuid4Generator {
 public:
  Uuid4Generator();
  // "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx", lowercase, y in 8..b. Thread-safe.
  std::string next();

 private:
  std::mutex mutex_;
  std::mt19937_64 rng_;
};

}  // namespace kvnode::controller
