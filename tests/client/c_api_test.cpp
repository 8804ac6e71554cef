// The C API (kvnode_client.h, libkvnode_client.so) without a node, or with a socket that never
// answers: connect errors with their status and message, the field-mask defaults (the timeout),
// every ErrorCode's status and name (the table from c_api/status_map.hpp), messages cut to fit and
// NUL-terminated, host memory, and NULL handles. c_api_kv_test.cpp: against a real kvnode.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <utility>

#include "c_api/status_map.hpp"
#include "kvnode/kvnode_client.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string temp_path(const std::string& name) {
  return "/tmp/kvnode-capi-" + name + "-" + std::to_string(::getpid()) + ".sock";
}

kvnode_connect_params_t params_for(const std::string& path) {
  kvnode_connect_params_t p{};
  p.socket_path = path.c_str();
  return p;
}

// A listening socket that accepts nothing and answers nothing.
class SilentSocket {
 public:
  explicit SilentSocket(std::string path) : path_(std::move(path)) {
    ::unlink(path_.c_str());
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path_.c_str(), sizeof(a.sun_path) - 1);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
  }
  ~SilentSocket() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  SilentSocket(const SilentSocket&) = delete;
  SilentSocket& operator=(const SilentSocket&) = delete;

 private:
  std::string path_;
  int fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
};

TEST(CApiConnect, FailsWithAStatusAndTheReason) {
  kvnode_error_t err{};
  kvnode_client_t* c = reinterpret_cast<kvnode_client_t*>(&err);  // must be reset to NULL
  EXPECT_EQ(kvnode_connect(nullptr, &c, &err), KVNODE_ERR_INVALID);
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(err.status, KVNODE_ERR_INVALID);
  EXPECT_STREQ(err.message, "kvnode_connect: params is NULL");
  const std::string missing = temp_path("missing");
  kvnode_connect_params_t p = params_for(missing);
  EXPECT_EQ(kvnode_connect(&p, nullptr, &err), KVNODE_ERR_INVALID);
  EXPECT_EQ(kvnode_connect(&p, &c, &err), KVNODE_ERR_NOT_FOUND);
  EXPECT_EQ(err.status, KVNODE_ERR_NOT_FOUND);
  EXPECT_NE(std::string(err.message).find("no kvnode local socket at " + missing),
            std::string::npos)
      << err.message;
  EXPECT_EQ(kvnode_connect(&p, &c, nullptr), KVNODE_ERR_NOT_FOUND) << "err may be NULL";
  {
    const std::string stale = temp_path("stale");  // bound, never listening: the node is gone
    ::unlink(stale.c_str());
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, stale.c_str(), sizeof(a.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    const kvnode_connect_params_t gone = params_for(stale);
    EXPECT_EQ(kvnode_connect(&gone, &c, &err), KVNODE_ERR_PEER_LOST);
    EXPECT_NE(std::string(err.message).find("nothing listens on " + stale), std::string::npos);
    ::close(fd);
    ::unlink(stale.c_str());
  }
  p.field_mask = 1u << 7;
  EXPECT_EQ(kvnode_connect(&p, &c, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(std::string(err.message).find("field_mask: bits 0x80"), std::string::npos);
  p.field_mask = KVNODE_CONNECT_FIELD_TIMEOUT;
  p.timeout_s = -1;
  EXPECT_EQ(kvnode_connect(&p, &c, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(std::string(err.message).find("params->timeout_s"), std::string::npos);
  p.socket_path = nullptr;
  EXPECT_EQ(kvnode_connect(&p, &c, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(std::string(err.message).find("params->socket_path"), std::string::npos);
  EXPECT_EQ(c, nullptr);
}

TEST(CApiConnect, TheTimeoutIsFifteenSecondsUnlessItsBitIsSet) {
  const std::string path = temp_path("silent");
  SilentSocket silent(path);
  kvnode_connect_params_t p = params_for(path);
  p.timeout_s = 0.3;  // ignored: its bit is not set
  const auto t0 = Clock::now();
  auto by_default = std::async(std::launch::async, [&] {
    kvnode_client_t* c = nullptr;
    kvnode_error_t err{};
    const kvnode_status_t s = kvnode_connect(&p, &c, &err);
    return std::make_pair(s, std::string(err.message));
  });
  kvnode_connect_params_t quick = params_for(path);
  quick.field_mask = KVNODE_CONNECT_FIELD_TIMEOUT;
  quick.timeout_s = 0.3;
  kvnode_client_t* c = nullptr;
  kvnode_error_t err{};
  EXPECT_EQ(kvnode_connect(&quick, &c, &err), KVNODE_ERR_DEADLINE);
  EXPECT_NE(std::string(err.message).find("timeout 300 ms"), std::string::npos) << err.message;
  EXPECT_LT(Clock::now() - t0, 5s);
  const auto [status, message] = by_default.get();
  EXPECT_EQ(status, KVNODE_ERR_DEADLINE);
  EXPECT_NE(message.find("timeout 15000 ms"), std::string::npos) << message;
  EXPECT_GE(Clock::now() - t0, 14s);
}

TEST(CApiStatus, EveryErrorCodeHasItsOwnStatusAndName) {
  EXPECT_STREQ(kvnode_status_string(KVNODE_OK), "ok");
  EXPECT_STREQ(kvnode_status_string(static_cast<kvnode_status_t>(42)), "unknown");
  for (int i = 0; i <= static_cast<int>(kvnode::ErrorCode::kInternal); ++i) {
    const auto code = static_cast<kvnode::ErrorCode>(i);
    const kvnode_status_t s = kvnode::c_api::to_status(code);
    EXPECT_EQ(s, -1 - i) << kvnode::to_string(code);  // kInvalid..kInternal are -1..-9, in order
    EXPECT_STREQ(kvnode_status_string(s), kvnode::to_string(code));
  }
  EXPECT_EQ(kvnode::c_api::to_status(kvnode::ErrorCode::kInternal), KVNODE_ERR_INTERNAL);
}

TEST(CApiStatus, MessagesAreCutToFitAndNulTerminated) {
  kvnode_error_t err;
  std::memset(&err, 'Z', sizeof err);
  std::string path = "/tmp/";
  while (path.size() < 3 * KVNODE_ERROR_MESSAGE_BYTES) path += "\xc3\xa9";  // é: two bytes
  kvnode_connect_params_t p = params_for(path);
  kvnode_client_t* c = nullptr;
  EXPECT_EQ(kvnode_connect(&p, &c, &err), KVNODE_ERR_INVALID);  // the path is too long
  const std::size_t n = strnlen(err.message, sizeof err.message);
  ASSERT_LT(n, sizeof err.message);
  EXPECT_GE(n, sizeof err.message - 2);  // cut at a character boundary
  EXPECT_EQ(static_cast<unsigned char>(err.message[n - 1]), 0xa9) << "whole characters only";
  // A success clears the error.
  kvnode_host_memory_t* m = nullptr;
  ASSERT_EQ(kvnode_host_memory_create(4096, nullptr, &m, &err), KVNODE_OK);
  EXPECT_EQ(err.status, KVNODE_OK);
  EXPECT_STREQ(err.message, "");
  kvnode_host_memory_free(m);
}

TEST(CApiHandles, NullHandlesAreFine) {
  kvnode_client_close(nullptr);
  kvnode_kv_close(nullptr);
  kvnode_host_memory_free(nullptr);
  EXPECT_EQ(kvnode_host_memory_data(nullptr), nullptr);
  EXPECT_EQ(kvnode_host_memory_size(nullptr), 0u);
  EXPECT_EQ(kvnode_host_memory_fd(nullptr), -1);
  kvnode_error_t err{};
  kvnode_node_info_t info{};
  std::size_t held = 1;
  EXPECT_EQ(kvnode_client_info(nullptr, &info, &err), KVNODE_ERR_INVALID);
  EXPECT_EQ(kvnode_lookup(nullptr, nullptr, 0, &held, &err), KVNODE_ERR_INVALID);
  kvnode_kv_transfer_params_t t{};
  kvnode_kv_result_t r{};
  r.field_mask = KVNODE_KV_RESULT_FIELD_CHUNKS;
  r.chunks = r.tokens = 1;
  EXPECT_EQ(kvnode_kv_store(nullptr, &t, &r, &err), KVNODE_ERR_INVALID);
  EXPECT_EQ(r.chunks, 0u);
  EXPECT_EQ(r.tokens, 1u) << "not asked for: not written";
  r.field_mask = 1u << 5;  // a field of a newer header: refused, nothing written
  EXPECT_EQ(kvnode_kv_load(nullptr, &t, &r, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(std::string(err.message).find("kvnode_kv_load: result->field_mask: bits 0x20"),
            std::string::npos)
      << err.message;
  EXPECT_EQ(r.chunks + r.tokens, 1u);
  kvnode_host_memory_t* m = nullptr;
  EXPECT_EQ(kvnode_host_memory_create(0, "empty", &m, &err), KVNODE_ERR_INVALID);
  EXPECT_EQ(m, nullptr);
}

}  // namespace
