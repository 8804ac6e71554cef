// Failure is the plane's verdict on a transfer; the node's metrics print one counter per value
// (PlaneCounters::failures, sized by kFailureCount), named by to_string(Failure).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "kvnode/transfer/plane.hpp"

namespace kvnode::transfer {
namespace {

TEST(Failure, EveryValueHasItsOwnName) {
  std::set<std::string> names;
  for (std::size_t f = 0; f < kFailureCount; ++f) {
    const std::string name = to_string(static_cast<Failure>(f));
    EXPECT_NE(name, "?") << "value " << f << " has no name";
    names.insert(name);
  }
  EXPECT_EQ(names.size(), kFailureCount);
  EXPECT_STREQ(to_string(Failure::kNone), "ok");
  EXPECT_STREQ(to_string(static_cast<Failure>(kFailureCount - 1)), "reset");
  EXPECT_EQ(std::size(PlaneCounters{}.failures), kFailureCount);
}

}  // namespace
}  // namespace kvnode::transfer
