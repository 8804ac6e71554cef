// The controller's threads carry names saying their job, so `top -H -p $(pidof kvcontroller)`
// and `perf top` tell an operator which of them is busy.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "kvnode/controller/http_api.hpp"
#include "zmq_peers.hpp"

namespace kvnode::test {
namespace {

std::map<std::string, int> thread_names() {
  std::map<std::string, int> names;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::string comm;
    std::getline(std::ifstream(task.path() / "comm"), comm);
    ++names[comm];
  }
  return names;
}

TEST(ControllerThreads, EachLoopIsNamedForItsJob) {
  auto ctl = start_controller();
  ASSERT_TRUE(ctl);
  constexpr int kHttp = 1 + static_cast<int>(controller::HttpApi::kHandlerThreads);  // + listener
  const std::map<std::string, int> expected = {
      {"kvc/ingest", 1},      {"kvc/reply", 1},  {"kvc/heartbeat", 1}, {"kvc/housekeep", 1},
      {"kvc/orchestrate", 1}, {"kvc/fanout", 1}, {"kvc/http", kHttp}};
  auto named = [&] {
    auto names = thread_names();
    for (const auto& [name, n] : expected)
      if (names[name] != n) return false;
    return true;
  };
  EXPECT_TRUE(eventually(named));  // each loop names itself once it runs
  ctl->stop();
  for (const auto& [name, n] : expected) EXPECT_EQ(thread_names()[name], 0) << name;
}

}  // namespace
}  // namespace kvnode::test
