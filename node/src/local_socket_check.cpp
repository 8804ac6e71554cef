#include "local_socket_check.hpp"

#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace kvnode::node {
namespace {

std::string user_name(uid_t uid) {
  std::vector<char> buf(4096);
  passwd pw{};
  passwd* found = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found) return found->pw_name;
  return "uid " + std::to_string(uid);
}

}  // namespace

Status check_local_socket(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT)
      return make_error("no kvnode local socket at " + path +
                        ": the file does not exist (is the node running? it logs 'local clients "
                        "at <path>' when it starts)");
    if (err == EACCES)
      return make_error("permission denied on " + path + " (a directory on the way is closed to " +
                        user_name(::geteuid()) + ")");
    return make_error("local socket " + path + ": " + std::strerror(err));
  }
  if (!S_ISSOCK(st.st_mode))
    return make_error(path + " is not a socket (is --node the right path?)");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return {};  // ZMQ will say so
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};  // out of descriptors: let the real connect report it
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  ::close(fd);
  if (rc == 0) return {};
  if (err == EACCES || err == EPERM)
    return make_error("permission denied on " + path + " (the socket is owner-only: run as " +
                      user_name(st.st_uid) + ")");
  if (err == ECONNREFUSED)
    return make_error("nothing listens on " + path +
                      ": the node that made this socket is gone (start it, or remove the file)");
  return make_error("local socket " + path + ": " + std::strerror(err));
}

}  // namespace kvnode::node
