// Interop with an unmodified LMCache worker and orchestrator client: lmcache_peer.py, written from
// the protocol reference with Debian's python3-zmq and python3-msgpack only, talks to the real
// kvcontroller binary over real sockets (ZMQ DEALER/PUSH/REP and HTTP) and checks every answer
// by value and by bytes. This wrapper picks free loopback ports, runs kvcontroller on them, runs
// the peer's scenario, and stops kvcontroller with SIGTERM (expecting exit code 0).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "support/child_process.hpp"
#include "support/process.hpp"

namespace kvnode::test {
namespace {

using namespace std::chrono_literals;

const std::string kPython = PYTHON3_PATH;
const std::string kController = KVCONTROLLER_PATH;
const std::string kPeer =
    (std::filesystem::path(__FILE__).parent_path() / "lmcache_peer.py").string();

// An IPv4 TCP socket that closes itself.
class Socket {
 public:
  Socket() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {}
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

// N distinct ports the kernel reports free on 127.0.0.1: all bound at once (so they differ), then
// released for kvcontroller to bind.
template <std::size_t N>
std::array<int, N> free_ports() {
  std::array<Socket, N> sockets;
  std::array<int, N> ports{};
  for (std::size_t i = 0; i < N; ++i) {
    sockaddr_in addr = loopback(0);
    socklen_t len = sizeof addr;
    if (sockets[i].fd() < 0 ||
        bind(sockets[i].fd(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        getsockname(sockets[i].fd(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      return {};
    ports[i] = ntohs(addr.sin_port);
  }
  return ports;
}

bool accepts_connections(int port) {
  Socket s;
  sockaddr_in addr = loopback(static_cast<std::uint16_t>(port));
  return s.fd() >= 0 && connect(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

bool python_has_zmq_and_msgpack() {
  return run_process({kPython, "-c", "import zmq, msgpack"}, "", 30s).exit_code == 0;
}

#define SKIP_WITHOUT_PYTHON_DEPS()                                              \
  if (!python_has_zmq_and_msgpack())                                            \
  GTEST_SKIP() << kPython                                                       \
               << " cannot `import zmq, msgpack` (apt-get install python3-zmq " \
                  "python3-msgpack); skipping the LMCache interop test"

std::string transcript(const ProcessResult& r) {
  return "exit code " + std::to_string(r.exit_code) + (r.exit_code == -1 ? " (timed out)" : "") +
         "\n--- peer stdout ---\n" + r.out + "--- peer stderr ---\n" + r.err;
}

TEST(LmcacheInterop, PeerEncoderAndHashMatchTheReference) {
  SKIP_WITHOUT_PYTHON_DEPS();
  const ProcessResult r =
      run_process({kPython, kPeer, "--self-test", "--shared-dir", KVNODE_SHARED_DIR}, "", 60s);
  EXPECT_EQ(r.exit_code, 0) << transcript(r);
}

TEST(LmcacheInterop, UnmodifiedWorkerAndOrchestratorAgainstKvcontroller) {
  SKIP_WITHOUT_PYTHON_DEPS();
  const auto [http, pull, reply, heartbeat] = free_ports<4>();
  ASSERT_NE(http, 0) << "no free loopback ports";
  const std::string monitor_ports = "{\"pull\":" + std::to_string(pull) +
                                    ",\"reply\":" + std::to_string(reply) +
                                    ",\"heartbeat\":" + std::to_string(heartbeat) + "}";
  ChildProcess controller({kController, "--host", "127.0.0.1", "--port", std::to_string(http),
                           "--monitor-ports", monitor_ports, "--health-check-interval", "1",
                           "--lmcache-worker-timeout", "3"});
  ASSERT_TRUE(controller.started()) << "cannot start " << kController;

  const auto deadline = std::chrono::steady_clock::now() + 15s;
  bool up = false;
  while (!up && controller.running() && std::chrono::steady_clock::now() < deadline) {
    up = accepts_connections(http) && accepts_connections(pull) && accepts_connections(reply) &&
         accepts_connections(heartbeat);
    if (!up) std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(up) << "kvcontroller did not accept connections on 127.0.0.1:" << http << ", " << pull
                  << ", " << reply << ", " << heartbeat << " within 15 s ("
                  << (controller.running() ? "still running" : controller.describe_exit())
                  << ")\n--- kvcontroller output ---\n"
                  << controller.output();

  const ProcessResult peer = run_process(
      {kPython, kPeer, "--host", "127.0.0.1", "--http-port", std::to_string(http), "--pull-port",
       std::to_string(pull), "--reply-port", std::to_string(reply), "--heartbeat-port",
       std::to_string(heartbeat), "--shared-dir", KVNODE_SHARED_DIR},
      "", 90s);
  EXPECT_EQ(peer.exit_code, 0) << transcript(peer) << "--- kvcontroller output ---\n"
                               << controller.output();

  ASSERT_TRUE(controller.running())
      << "kvcontroller died during the scenario: " << controller.describe_exit()
      << "\n--- kvcontroller output ---\n"
      << controller.output();
  const std::optional<int> code = controller.stop(SIGTERM, 5s);
  EXPECT_EQ(code, std::optional<int>(0))
      << "kvcontroller did not exit with code 0 within 5 s of SIGTERM ("
      << controller.describe_exit() << ")\n--- kvcontroller output ---\n"
      << controller.output();
}

}  // namespace
}  // namespace kvnode::test
