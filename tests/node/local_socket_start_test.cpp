// The local socket appears only once it listens: a client that finds the file connects. Before,
// the file was bound at its path and listened on a moment later, so a client racing the node's
// start could meet "nothing listens on <path>" (ECONNREFUSED) and conclude the node was gone.
// Here a thread connects as fast as it can while servers start and stop 200 times.
#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <thread>

#include "local_rig.hpp"
#include "local_socket_server.hpp"

namespace kvnode::node {
namespace {

using namespace local_rig;

TEST(LocalSocketStart, TheFileAppearsOnlyOnceItListens) {
  const std::string path = temp_socket("start-race");
  std::atomic<bool> done{false};
  std::atomic<int> refused{0}, connected{0};
  std::thread racer([&] {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    while (!done) {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
        ++connected;
      } else if (errno == ECONNREFUSED && ::access(path.c_str(), F_OK) == 0) {
        ++refused;  // a file there that does not listen (yet, or no more)
      }
      ::close(fd);
    }
  });
  for (int i = 0; i < 200; ++i) {
    local::SocketServerOptions o;
    o.path = path;
    auto server = local::LocalSocketServer::listen(o);
    ASSERT_TRUE(server) << server.error().message;
    std::this_thread::sleep_for(100us);
    (*server)->stop();  // the file goes before the listener closes
  }
  done = true;
  racer.join();
  EXPECT_GT(connected.load(), 0) << "the racer reached some of them";
  EXPECT_EQ(refused.load(), 0) << "a file was there that did not listen";
}

}  // namespace
}  // namespace kvnode::node
