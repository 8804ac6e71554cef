#include "unix_socket.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "kvnode/client/kv_wire.hpp"
#include "kvnode/client/local_framing.hpp"
#include "kvnode/client/local_protocol.hpp"

namespace kvnode::client::detail {
namespace {

std::string user_name(uid_t uid) {
  std::vector<char> buf(4096);
  passwd pw{};
  passwd* found = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found) return found->pw_name;
  return "uid " + std::to_string(uid);
}

// Why connect(2) failed, in words a person acts on; stat tells the cases apart.
Error connect_error(const std::string& path, int err) {
  struct stat st {};
  const bool stat_ok = ::stat(path.c_str(), &st) == 0;
  const int stat_err = stat_ok ? 0 : errno;
  if (err == ENOENT || stat_err == ENOENT)
    return make_error(ErrorCode::kNotFound,
                      "no kvnode local socket at " + path +
                          ": the file does not exist (is the node running? it logs 'local clients "
                          "at <path>' when it starts)");
  if (stat_err == EACCES)
    return make_error(ErrorCode::kRefused, "permission denied on " + path +
                                               " (a directory on the way is closed to " +
                                               user_name(::geteuid()) + ")");
  if (stat_ok && !S_ISSOCK(st.st_mode))
    return make_error(ErrorCode::kInvalid,
                      path + " is not a socket (is it the node's local socket path?)");
  if (err == EACCES || err == EPERM)
    return make_error(ErrorCode::kRefused,
                      "permission denied on " + path + " (the socket is owner-only: run as " +
                          (stat_ok ? user_name(st.st_uid) : std::string("its owner")) + ")");
  if (err == ECONNREFUSED)
    return make_error(
        ErrorCode::kPeerLost,
        "nothing listens on " + path +
            ": the node that made this socket is gone (start it, or remove the file)");
  return make_error(ErrorCode::kIo, "local socket " + path + ": " + std::strerror(err));
}

// Waits until `fd` is ready for `events` or the deadline passes; false on the deadline.
Result<bool> wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 60'000)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR)
      return make_error(ErrorCode::kIo, std::string("poll: ") + std::strerror(errno));
  }
}

Error lost(const char* what, int err) {
  return make_error(ErrorCode::kPeerLost,
                    std::string("the node closed the connection while ") + what +
                        (err != 0 ? std::string(" (") + std::strerror(err) + ")" : ""));
}

}  // namespace

Result<UniqueFd> connect_unix(const std::string& path, Clock::time_point deadline) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    return make_error(ErrorCode::kInvalid, "local socket path '" + path + "': empty or over " +
                                               std::to_string(sizeof(addr.sun_path) - 1) +
                                               " bytes");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return make_error(ErrorCode::kIo, std::string("socket: ") + std::strerror(errno));
  // A unix connect completes at once or fails at once; EAGAIN is a full backlog: try again.
  for (;;) {
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
    const int err = errno;
    if (err == EINTR) continue;
    if (err != EAGAIN) return connect_error(path, err);
    if (Clock::now() >= deadline)
      return make_error(ErrorCode::kDeadline,
                        "kvnode at " + path + " did not accept the connection in time (busy)");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Status send_frame(int fd, std::span<const std::byte> body, Clock::time_point deadline,
                  std::span<const int> fds) {
  if (fds.size() > kMaxKvFds)
    return make_error(ErrorCode::kInvalid, std::to_string(fds.size()) +
                                               " descriptors in one request, at most " +
                                               std::to_string(kMaxKvFds));
  // The descriptors ride on the first sendmsg that takes any byte.
  std::vector<char> control(fds.empty() ? 0 : CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    msghdr shape{};
    shape.msg_control = control.data();
    shape.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&shape);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  if (body.size() > protocol::kMaxMessageBytes)
    return make_error(ErrorCode::kInvalid, "a request of " + std::to_string(body.size()) +
                                               " bytes is over the limit of " +
                                               std::to_string(protocol::kMaxMessageBytes));
  const auto header = protocol::frame_header(static_cast<std::uint32_t>(body.size()));
  std::size_t sent = 0;
  const std::size_t total = header.size() + body.size();
  while (sent < total) {
    iovec parts[2];
    int count = 0;
    if (sent < header.size())
      parts[count++] = {const_cast<std::byte*>(header.data() + sent), header.size() - sent};
    const std::size_t body_sent = sent < header.size() ? 0 : sent - header.size();
    if (body_sent < body.size())
      parts[count++] = {const_cast<std::byte*>(body.data() + body_sent), body.size() - body_sent};
    msghdr msg{};
    msg.msg_iov = parts;
    msg.msg_iovlen = static_cast<std::size_t>(count);
    if (sent == 0 && !control.empty()) {
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
    }
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);  // no SIGPIPE in the engine's process
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    const int err = errno;
    if (err == EINTR) continue;
    if (err != EAGAIN && err != EWOULDBLOCK) return lost("taking the request", err);
    Result<bool> ready = wait_for(fd, POLLOUT, deadline);
    if (!ready) return ready.error();
    if (!*ready)
      return make_error(ErrorCode::kDeadline, "the node did not take the request in time");
  }
  return {};
}

bool idle_and_open(int fd) {
  std::byte probe{};
  for (;;) {
    const ssize_t n = ::recv(fd, &probe, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

Result<std::vector<std::byte>> receive_frame(int fd, Clock::time_point deadline) {
  protocol::FrameReader reader;
  for (;;) {
    const std::span<std::byte> space = reader.space();
    const ssize_t n = ::recv(fd, space.data(), space.size(), 0);
    if (n > 0) {
      switch (reader.advance(static_cast<std::size_t>(n))) {
        case protocol::FrameReader::Progress::kMore:
          continue;
        case protocol::FrameReader::Progress::kFrame:
          return reader.take();
        case protocol::FrameReader::Progress::kTooLarge:
          return make_error(ErrorCode::kInternal, "the node answered a frame of " +
                                                      std::to_string(reader.declared()) +
                                                      " bytes, over the limit of " +
                                                      std::to_string(protocol::kMaxMessageBytes));
      }
    }
    if (n == 0) return lost("answering", 0);
    const int err = errno;
    if (err == EINTR) continue;
    if (err != EAGAIN && err != EWOULDBLOCK) return lost("answering", err);
    Result<bool> ready = wait_for(fd, POLLIN, deadline);
    if (!ready) return ready.error();
    if (!*ready) return make_error(ErrorCode::kDeadline, "no answer in time");
  }
}

}  // namespace kvnode::client::detail
