// Large request bodies must not leave memory behind in kvcontroller (issue 19, item 6): after
// eight parallel /lookup requests of 12 MB each, the process's resident memory returns near
// where it started. A real kvcontroller process, so what is measured is the daemon's allocator as
// it runs (kvcontroller keeps up to 64 MiB free per malloc arena for speed).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "support/child_process.hpp"
#include "support/http_client.hpp"

namespace kvnode::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kClients = 8;
constexpr std::size_t kTokens = 2'000'000;  // about 12 MB of JSON each
constexpr long kMiB = 1 << 20;
constexpr long kAllowedGrowth = 64 * kMiB;  // what may stay resident after the bodies are freed

// Our child kvcontroller's pid: ChildProcess does not say, /proc does.
pid_t child_named(const std::string& comm) {
  for (const auto& proc : std::filesystem::directory_iterator("/proc")) {
    std::ifstream stat(proc.path() / "stat");
    std::string pid, name, state;
    pid_t ppid = 0;
    if (!(stat >> pid >> name >> state >> ppid)) continue;
    if (ppid == ::getpid() && name == "(" + comm + ")") return static_cast<pid_t>(std::stol(pid));
  }
  return -1;
}

// VmRSS or VmHWM of `pid`, in bytes.
long status_bytes(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1)) * 1024;
  return -1;
}

int http_port_of(ChildProcess& p) {
  static const std::regex listening(R"(listening on [^:]*: http (\d+))");
  for (const auto until = Clock::now() + 20s; Clock::now() < until && p.running();) {
    std::smatch m;
    const std::string out = p.output();
    if (std::regex_search(out, m, listening)) return std::stoi(m[1]);
    std::this_thread::sleep_for(20ms);
  }
  return -1;
}

std::string lookup_body() {
  std::string body = R"({"tokens":[)";
  body.reserve(kTokens * 7);
  for (std::size_t i = 0; i < kTokens; ++i) {
    body += std::to_string(10000 + i % 50000);
    body += ',';
  }
  body.back() = ']';
  return body + "}";
}

TEST(HttpMemory, LargeBodiesLeaveNoMemoryBehind) {
#if defined(__SANITIZE_ADDRESS__)
  // ASan's allocator keeps freed memory in quarantine and never hands it back as glibc does, so
  // RSS here says nothing about the daemon; the RelWithDebInfo build runs this test.
  GTEST_SKIP() << "RSS after frees is meaningless under AddressSanitizer";
#endif
  ChildProcess ctl({KVCONTROLLER_PATH, "--host", "127.0.0.1", "--port", "0", "--monitor-ports",
                    R"({"pull": 0, "reply": 0, "heartbeat": 0})"});
  const int port = http_port_of(ctl);
  ASSERT_GT(port, 0) << ctl.describe_exit() << "\n" << ctl.output();
  const pid_t pid = child_named("kvcontroller");
  ASSERT_GT(pid, 0);
  const std::string body = lookup_body();
  auto lookup = [&] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60s);
    c.set_write_timeout(60s);
    auto r = c.Post("/lookup", body, "application/json");
    return r ? r->status : 0;
  };
  ASSERT_EQ(lookup(), 200);  // the first request faults in what every request needs
  const long before = status_bytes(pid, "VmRSS");

  std::vector<std::future<int>> replies;
  for (int i = 0; i < kClients; ++i) replies.push_back(std::async(std::launch::async, lookup));
  for (auto& r : replies) EXPECT_EQ(r.get(), 200);
  const long peak = status_bytes(pid, "VmHWM");
  // The answers leave before the server frees and trims: allow it a moment.
  long after = status_bytes(pid, "VmRSS");
  for (const auto until = Clock::now() + 5s;
       after - before >= kAllowedGrowth && Clock::now() < until;) {
    std::this_thread::sleep_for(20ms);
    after = status_bytes(pid, "VmRSS");
  }
  std::printf(
      "kvcontroller RSS: %ld MiB before, peak %ld MiB, %ld MiB after %d parallel %zu MB lookups\n",
      before / kMiB, peak / kMiB, after / kMiB, kClients, body.size() / 1000000);
  EXPECT_LT(after - before, kAllowedGrowth)
      << "before " << before / kMiB << " MiB, after " << after / kMiB << " MiB";
}

}  // namespace
}  // namespace kvnode::test
