// Issue 19 item 12: a second kvnode with the same instance and rank (so the same local socket and
// staging region) refuses to start, exit 1 naming the running node, and touches nothing of it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <thread>

#include "kvnode/client/local_client.hpp"
#include "support/child_process.hpp"

namespace kvnode::node {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using client::LocalClient;

std::vector<std::string> node_argv(const std::string& instance) {
  // No controller listens at these ports: registration keeps retrying, which is fine here.
  return {KVNODE_PATH,   "--instance-id",
          instance,      "--worker-id",
          "0",           "--controller-pull-url",
          "127.0.0.1:1", "--controller-reply-url",
          "127.0.0.1:2", "--chunk-bytes",
          "65536",       "--max-local-cpu-size",
          "0.01",        "--http-port",
          "-1",          "--local-staging-mb",
          "1",           "--ucx-tls",
          "tcp",         "--ucx-net-devices",
          "lo"};
}

struct FileId {
  ino_t inode = 0;
  dev_t device = 0;
  bool operator==(const FileId&) const = default;
};
std::optional<FileId> file_id(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_ino, st.st_dev};
}

TEST(SingleInstance, ASecondNodeForTheSameInstanceAndRankRefusesAndTouchesNothing) {
  const std::string instance = "dup-" + std::to_string(::getpid());
  const std::string socket = "/tmp/kvnode-" + instance + "-0.sock";
  const std::string shm = "/dev/shm/kvnode_tmp_kvnode-" + instance + "-0.sock";
  test::ChildProcess first(node_argv(instance));
  std::unique_ptr<LocalClient> client;
  for (auto until = Clock::now() + 30s; !client && Clock::now() < until;
       std::this_thread::sleep_for(50ms)) {
    ASSERT_TRUE(first.running()) << first.describe_exit() << "\n" << first.output();
    if (file_id(socket))
      if (auto c = LocalClient::connect(socket, {.timeout = 2000ms})) client = std::move(c).value();
  }
  ASSERT_TRUE(client) << first.output();
  const auto socket_before = file_id(socket);
  const auto shm_before = file_id(shm);
  ASSERT_TRUE(shm_before) << "no staging region at " << shm << "\n" << first.output();

  test::ChildProcess second(node_argv(instance));
  for (auto until = Clock::now() + 30s; second.running() && Clock::now() < until;)
    std::this_thread::sleep_for(20ms);
  ASSERT_FALSE(second.running()) << second.output();
  EXPECT_EQ(second.describe_exit(), "exited with code 1") << second.output();
  const std::string said = second.output();
  EXPECT_NE(said.find("pid " + std::to_string(first.pid())), std::string::npos) << said;
  EXPECT_NE(said.find(socket), std::string::npos) << said;

  // The running node kept its socket, its staging region and its clients.
  EXPECT_EQ(file_id(socket), socket_before);
  EXPECT_EQ(file_id(shm), shm_before);
  EXPECT_TRUE(first.running());
  auto again = LocalClient::connect(socket, {.timeout = 5000ms});
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_TRUE((*again)->shared_memory());
  EXPECT_EQ(first.stop(SIGTERM, 10s), 0) << first.output();
}

}  // namespace
}  // namespace kvnode::node
