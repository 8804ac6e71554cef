// process_vm_readv/writev copiers (see process_copy.hpp).
#include "process_copy.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace kvnode::node::local {
namespace {

constexpr std::size_t kSegmentsPerCall = 512;  // IOV_MAX is 1024: well inside it

Error errno_error(int e, const std::string& what) {
  const ErrorCode code = e == EPERM || e == EACCES    ? ErrorCode::kRefused
                         : e == ESRCH                 ? ErrorCode::kPeerLost
                         : e == EFAULT || e == EINVAL ? ErrorCode::kInvalid
                                                      : ErrorCode::kIo;
  std::string text = what + ": " + std::strerror(e);
  if (code == ErrorCode::kRefused)
    text +=
        " (this node may not read the engine's memory: run both as one user, with Yama's "
        "ptrace_scope 0 or the engine allowing it; or give the node memory it can map)";
  return Error{code, text};
}

class ProcessCopier final : public gpu::SegmentCopier {
 public:
  ProcessCopier(const EngineProcess& engine, bool remote_source)
      : engine_(engine), remote_source_(remote_source) {}

  Status wait(const gpu::IpcHandle&) override {
    return make_error(ErrorCode::kInvalid, "the process copier cannot wait on a CUDA event");
  }
  Status record(const gpu::IpcHandle&) override {
    return make_error(ErrorCode::kInvalid, "the process copier cannot record a CUDA event");
  }
  Status synchronize() override { return {}; }
  bool on_device() const override { return false; }
  const char* name() const override { return "process_vm"; }

  // The segments in the order of their addresses in the engine, so that its side coalesces
  // into few large iovecs (the kernel pins the engine's pages per iovec: 2 KiB pairs ran at
  // 2.0 GB/s here, the same bytes as one remote 1 MiB range at 2.7), ours as many as needed.
  Status copy(std::span<const gpu::CopySegment> segments) override {
    if (Status s = engine_.alive(); !s) return s;
    auto theirs = [this](const gpu::CopySegment& s) {
      return remote_source_ ? const_cast<std::byte*>(s.src) : s.dst;
    };
    auto mine = [this](const gpu::CopySegment& s) {
      return remote_source_ ? s.dst : const_cast<std::byte*>(s.src);
    };
    std::vector<std::size_t> order;
    order.reserve(segments.size());
    for (std::size_t i = 0; i < segments.size(); ++i)
      if (segments[i].bytes > 0) order.push_back(i);
    std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
      return theirs(segments[x]) < theirs(segments[y]);
    });
    std::vector<iovec> local, remote;
    local.reserve(std::min(order.size(), kSegmentsPerCall));
    remote.reserve(local.capacity());
    std::size_t want = 0;
    auto flush = [&]() -> Status {
      if (local.empty()) return {};
      const char* what = remote_source_ ? "process_vm_readv" : "process_vm_writev";
      const ssize_t got = remote_source_
                              ? ::process_vm_readv(engine_.pid, local.data(), local.size(),
                                                   remote.data(), remote.size(), 0)
                              : ::process_vm_writev(engine_.pid, local.data(), local.size(),
                                                    remote.data(), remote.size(), 0);
      if (got < 0) return errno_error(errno, what);
      if (static_cast<std::size_t>(got) != want)
        return make_error(ErrorCode::kInvalid,
                          std::string(what) + ": " + std::to_string(got) + " of " +
                              std::to_string(want) +
                              " bytes (the engine's memory is no longer all mapped)");
      local.clear();
      remote.clear();
      want = 0;
      return {};
    };
    for (const std::size_t i : order) {
      const gpu::CopySegment& s = segments[i];
      if (local.size() == kSegmentsPerCall)
        if (Status st = flush(); !st) return st;
      local.push_back({mine(s), s.bytes});
      std::byte* at = theirs(s);
      if (!remote.empty() &&
          static_cast<std::byte*>(remote.back().iov_base) + remote.back().iov_len == at)
        remote.back().iov_len += s.bytes;
      else
        remote.push_back({at, s.bytes});
      want += s.bytes;
    }
    if (Status st = flush(); !st) return st;
    return engine_.alive();  // exited meanwhile: the pid may name another process now
  }

 private:
  const EngineProcess& engine_;
  bool remote_source_;
};

}  // namespace

Status EngineProcess::alive() const {
  if (!pidfd) return {};
  pollfd p{pidfd.get(), POLLIN, 0};
  if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)))
    return make_error(ErrorCode::kPeerLost,
                      "the engine process " + std::to_string(pid) + " exited");
  return {};
}

Result<EngineProcess> open_engine_process(int pid, std::uintptr_t address, const char* what) {
  if (pid <= 0)
    return make_error(ErrorCode::kInvalid, std::string(what) +
                                               ": the engine's own memory needs its process id, "
                                               "which this connection did not give (SO_PEERCRED)");
  EngineProcess e;
  e.pid = pid;
#ifdef SYS_pidfd_open
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0)
    e.pidfd = UniqueFd(static_cast<int>(fd));
  else if (errno == ESRCH)
    return make_error(ErrorCode::kPeerLost, std::string(what) + ": the engine process exited");
#endif
  std::byte probe{};
  iovec local{&probe, 1};
  iovec remote{reinterpret_cast<void*>(address), 1};
  if (::process_vm_readv(pid, &local, 1, &remote, 1, 0) != 1)
    return errno_error(errno, std::string(what) + ": reading the engine's memory");
  return e;
}

std::unique_ptr<gpu::SegmentCopier> make_process_copier(const EngineProcess& engine,
                                                        bool remote_source) {
  return std::make_unique<ProcessCopier>(engine, remote_source);
}

}  // namespace kvnode::node::local
