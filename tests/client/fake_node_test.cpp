// LocalClient against a scripted fake node on a real unix socket: the failures a real node
// rarely shows on cue. connect() fails at once with the reason and its code; a node that does
// not answer is kDeadline within the timeout; one that closes is kPeerLost; a garbage or
// oversized answer is an error; and after each, the next call connects again.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "kvnode/client/local_client.hpp"
#include "kvnode/client/local_protocol.hpp"

namespace kvnode::client {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string temp_path(const std::string& name) {
  return "/tmp/kvnode-fake-" + std::to_string(::getpid()) + "-" + name + ".sock";
}

// One accepted connection of the fake node.
class FakeConnection {
 public:
  explicit FakeConnection(int fd) : fd_(fd) {}
  ~FakeConnection() { ::close(fd_); }
  FakeConnection(const FakeConnection&) = delete;
  FakeConnection& operator=(const FakeConnection&) = delete;

  // The next request; nullopt when the client closed the connection (or 5 s passed).
  std::optional<protocol::Request> read() {
    std::string header, body;
    if (!read_exactly(header, 4)) return std::nullopt;
    std::uint32_t length = 0;
    for (int i = 0; i < 4; ++i)
      length |= static_cast<std::uint32_t>(static_cast<unsigned char>(header[i])) << (8 * i);
    if (!read_exactly(body, length)) return std::nullopt;
    Result<protocol::Request> q =
        protocol::decode_request(std::as_bytes(std::span(body.data(), body.size())));
    EXPECT_TRUE(q) << q.error().message;
    return q ? std::optional(std::move(q).value()) : std::nullopt;
  }
  void send_raw(const std::string& bytes) {
    (void)!::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  void reply(const protocol::Reply& r) {
    const std::vector<std::byte> body = protocol::encode(r);
    std::string wire(4, '\0');
    for (int i = 0; i < 4; ++i) wire[i] = static_cast<char>(body.size() >> (8 * i));
    wire.append(reinterpret_cast<const char*>(body.data()), body.size());
    send_raw(wire);
  }
  // Answers info as a node of 4 KiB chunks without staging (save_unfull_chunk unsaid: as an
  // older node).
  bool serve_info(std::optional<bool> save_unfull_chunk = std::nullopt) {
    std::optional<protocol::Request> q = read();
    if (!q || q->op != protocol::LocalOp::kInfo) return false;
    protocol::Reply r;
    r.chunk_bytes = 4096;
    r.chunk_size = 16;
    r.pages = 8;
    r.instance = "fake";
    r.save_unfull_chunk = save_unfull_chunk;
    reply(r);
    return true;
  }
  void wait_closed() {
    std::optional<protocol::Request> q;
    while ((q = read())) {
    }
  }

 private:
  bool read_exactly(std::string& out, std::size_t n) {
    out.clear();
    const auto until = Clock::now() + 5s;
    while (out.size() < n && Clock::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[65536];
      const ssize_t got = ::recv(fd_, buf, std::min(sizeof buf, n - out.size()), 0);
      if (got <= 0) return false;
      out.append(buf, static_cast<std::size_t>(got));
    }
    return out.size() == n;
  }
  int fd_;
};

// Listens at a path and runs `script` on each connection in turn (the n-th is numbered n).
class FakeNode {
 public:
  using Script = std::function<void(FakeConnection&, int)>;
  FakeNode(std::string path, Script script) : path_(std::move(path)), script_(std::move(script)) {
    ::unlink(path_.c_str());
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path_.c_str(), sizeof(a.sun_path) - 1);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    thread_ = std::thread([this] { run(); });
  }
  ~FakeNode() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  int connections() const { return connections_; }
  int closed() const { return closed_; }  // connections the fake node has closed

 private:
  void run() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      {
        FakeConnection connection(c);
        script_(connection, connections_++);
      }
      ++closed_;
    }
  }
  std::string path_;
  Script script_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::atomic<int> closed_{0};
  std::thread thread_;
};

LocalClientOptions quick() {
  LocalClientOptions o;
  o.timeout = 300ms;
  return o;
}

void answer_contains(FakeConnection& c) {
  std::optional<protocol::Request> q = c.read();
  ASSERT_TRUE(q);
  ASSERT_EQ(q->op, protocol::LocalOp::kContains);
  protocol::Reply r;
  r.present.assign(q->hashes.size(), true);
  c.reply(r);
}

TEST(LocalClientConnect, FailsAtOnceSayingWhy) {
  const auto t0 = Clock::now();
  auto missing = LocalClient::connect(temp_path("missing"), quick());
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  EXPECT_NE(missing.error().message.find("the file does not exist"), std::string::npos);

  const std::string file = temp_path("plain-file");
  std::ofstream(file) << "not a socket";
  auto plain = LocalClient::connect(file, quick());
  ::unlink(file.c_str());
  ASSERT_FALSE(plain);
  EXPECT_EQ(plain.error().code, ErrorCode::kInvalid);
  EXPECT_NE(plain.error().message.find("is not a socket"), std::string::npos)
      << plain.error().message;

  // A socket file whose node is gone (bound, never listening: ECONNREFUSED).
  const std::string stale = temp_path("stale");
  ::unlink(stale.c_str());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, stale.c_str(), sizeof(a.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  auto refused = LocalClient::connect(stale, quick());
  ::close(fd);
  ::unlink(stale.c_str());
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kPeerLost);
  EXPECT_NE(refused.error().message.find("nothing listens on " + stale), std::string::npos)
      << refused.error().message;

  auto too_long = LocalClient::connect("/tmp/" + std::string(200, 'x'), quick());
  ASSERT_FALSE(too_long);
  EXPECT_EQ(too_long.error().code, ErrorCode::kInvalid);
  EXPECT_LT(Clock::now() - t0, 250ms) << "none of these waits for the timeout";
}

TEST(LocalClientFaults, ASilentNodeIsADeadlineAndTheNextCallConnectsAgain) {
  FakeNode node(temp_path("silent"), [](FakeConnection& c, int n) {
    if (n == 0) {
      ASSERT_TRUE(c.serve_info());
      ASSERT_TRUE(c.read());  // and never answers it
      c.wait_closed();
      return;
    }
    ASSERT_TRUE(c.serve_info());  // a reconnecting client asks for the geometry again
    answer_contains(c);
  });
  auto client = LocalClient::connect(temp_path("silent"), quick());
  ASSERT_TRUE(client) << client.error().message;
  const auto t0 = Clock::now();
  Result<std::vector<bool>> r = (*client)->contains(ChunkKeys::of_hashes({1, 2}));
  const auto took = Clock::now() - t0;
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kDeadline) << r.error().message;
  EXPECT_NE(r.error().message.find("timeout 300 ms"), std::string::npos) << r.error().message;
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 2s);
  Result<std::vector<bool>> again = (*client)->contains(ChunkKeys::of_hashes({1, 2}));
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(*again, (std::vector<bool>{true, true}));
  EXPECT_EQ(node.connections(), 2);
}

TEST(LocalClientFaults, ANodeThatClosesIsPeerLostAndTheNextCallConnectsAgain) {
  FakeNode node(temp_path("closes"), [](FakeConnection& c, int n) {
    ASSERT_TRUE(c.serve_info());
    if (n == 0) {
      ASSERT_TRUE(c.read());  // then closes without answering
      return;
    }
    answer_contains(c);
  });
  auto client = LocalClient::connect(temp_path("closes"), quick());
  ASSERT_TRUE(client) << client.error().message;
  Result<std::vector<bool>> r = (*client)->contains(ChunkKeys::of_hashes({3}));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kPeerLost) << r.error().message;
  Result<std::vector<bool>> again = (*client)->contains(ChunkKeys::of_hashes({3}));
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(*again, std::vector<bool>{true});
}

// A node that closed the connection while it was idle (restarted, or cut it): the next call
// notices before sending, connects again and succeeds, first time.
TEST(LocalClientFaults, AConnectionTheNodeClosedWhileIdleIsReplacedBeforeTheCall) {
  FakeNode node(temp_path("idle-closed"), [](FakeConnection& c, int n) {
    ASSERT_TRUE(c.serve_info());
    if (n == 0) return;  // closes, idle
    answer_contains(c);
    c.wait_closed();
  });
  auto client = LocalClient::connect(temp_path("idle-closed"), quick());
  ASSERT_TRUE(client) << client.error().message;
  const auto until = Clock::now() + 5s;
  while (node.closed() < 1 && Clock::now() < until) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(node.closed(), 1);
  Result<std::vector<bool>> r = (*client)->contains(ChunkKeys::of_hashes({8}));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(*r, std::vector<bool>{true});
  EXPECT_EQ(node.connections(), 2);
}

// A node over its connection cap answers one refusal frame and closes: the client says
// kRefused with the node's words, not a lost peer.
TEST(LocalClientFaults, ARefusalBeforeCloseIsKRefused) {
  FakeNode node(temp_path("refuses"), [](FakeConnection& c, int) {
    c.reply(protocol::failure(make_error(ErrorCode::kRefused, "over max_connections 1")));
  });
  auto client = LocalClient::connect(temp_path("refuses"), quick());
  ASSERT_FALSE(client);
  EXPECT_EQ(client.error().code, ErrorCode::kRefused) << client.error().message;
  EXPECT_NE(client.error().message.find("over max_connections 1"), std::string::npos);
}

TEST(LocalClientFaults, GarbageOrAnOversizedAnswerIsAnErrorAndDropsTheConnection) {
  FakeNode node(temp_path("garbage"), [](FakeConnection& c, int n) {
    ASSERT_TRUE(c.serve_info());
    ASSERT_TRUE(c.read());
    if (n == 0) c.send_raw(std::string("\x03\x00\x00\x00\xc1\xc1\xc1", 7));
    if (n == 1) c.send_raw(std::string("\xff\xff\xff\xff", 4));  // 4 GiB declared
    if (n == 2) {
      protocol::Reply r;
      r.present = {false};
      c.reply(r);
    }
    c.wait_closed();
  });
  auto client = LocalClient::connect(temp_path("garbage"), quick());
  ASSERT_TRUE(client) << client.error().message;
  Result<std::vector<bool>> garbage = (*client)->contains(ChunkKeys::of_hashes({4}));
  ASSERT_FALSE(garbage);
  EXPECT_EQ(garbage.error().code, ErrorCode::kInternal) << garbage.error().message;
  Result<std::vector<bool>> huge = (*client)->contains(ChunkKeys::of_hashes({4}));
  ASSERT_FALSE(huge);
  EXPECT_EQ(huge.error().code, ErrorCode::kInternal) << huge.error().message;
  EXPECT_NE(huge.error().message.find("over the limit"), std::string::npos);
  Result<std::vector<bool>> fine = (*client)->contains(ChunkKeys::of_hashes({4}));
  ASSERT_TRUE(fine) << fine.error().message;
  EXPECT_EQ(*fine, std::vector<bool>{false});
}

TEST(LocalClientFaults, ANodeThatStopsReadingIsADeadlineOnSending) {
  FakeNode node(temp_path("no-reader"), [](FakeConnection& c, int) {
    ASSERT_TRUE(c.serve_info());
    std::this_thread::sleep_for(1500ms);  // reads nothing while the client sends
  });
  LocalClientOptions o = quick();
  o.use_shared_memory = false;
  auto client = LocalClient::connect(temp_path("no-reader"), o);
  ASSERT_TRUE(client) << client.error().message;
  // 64 Ki hashes of 9 msgpack bytes each: 576 KiB, more than a unix socket buffers.
  const std::vector<std::int64_t> many(64 << 10, INT64_MAX);
  const auto t0 = Clock::now();
  Result<std::vector<bool>> r = (*client)->contains(ChunkKeys::of_hashes(many));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kDeadline) << r.error().message;
  EXPECT_LT(Clock::now() - t0, 1s);
}

// A node that answers an error keeps its code through the client.
TEST(LocalClientFaults, TheNodesErrorCodeReachesTheCaller) {
  FakeNode node(temp_path("frozen"), [](FakeConnection& c, int) {
    ASSERT_TRUE(c.serve_info());
    ASSERT_TRUE(c.read());
    c.reply(protocol::failure(make_error(ErrorCode::kFrozen, "frozen: a full sync is running")));
    ASSERT_TRUE(c.read());
    c.reply(protocol::failure(make_error(ErrorCode::kNoRoom, "full")));
    c.wait_closed();
  });
  LocalClientOptions o = quick();
  o.use_shared_memory = false;
  auto client = LocalClient::connect(temp_path("frozen"), o);
  ASSERT_TRUE(client) << client.error().message;
  const std::vector<std::byte> data(4096);
  Result<std::size_t> put = (*client)->put(ChunkKeys::of_hashes({1}), data);
  ASSERT_FALSE(put);
  EXPECT_EQ(put.error().code, ErrorCode::kFrozen) << put.error().message;
  EXPECT_NE(put.error().message.find("(0 chunks stored before)"), std::string::npos);
  Result<std::vector<bool>> has = (*client)->contains(ChunkKeys::of_hashes({1}));
  ASSERT_FALSE(has);
  EXPECT_EQ(has.error().code, ErrorCode::kNoRoom);
}

// NodeInfo::save_unfull_chunk is the node's word; a node that does not say (an older one) hashed
// a last partial chunk, so it reads true.
TEST(LocalClientInfo, SaveUnfullChunkIsTheNodesOrTrueWhenUnsaid) {
  for (const std::optional<bool> said :
       {std::optional<bool>(false), std::optional<bool>(true), std::optional<bool>()}) {
    FakeNode node(temp_path("unfull"), [&](FakeConnection& c, int) {
      ASSERT_TRUE(c.serve_info(said));
      c.wait_closed();
    });
    LocalClientOptions o = quick();
    o.use_shared_memory = false;
    auto client = LocalClient::connect(temp_path("unfull"), o);
    ASSERT_TRUE(client) << client.error().message;
    EXPECT_EQ((*client)->info().save_unfull_chunk, said.value_or(true));
  }
}

}  // namespace
}  // namespace kvnode::client
