// Copies between this node's pool and an engine process's own memory that the node cannot map
// (KvMemoryKind::kHostProcess): process_vm_readv (a store) and process_vm_writev (a load), Linux
// cross-memory attach, one system call per 512 segments. Nothing is mapped, so an engine that
// unmaps or shrinks its memory makes a copy fail (EFAULT), never the node. The engine is held by
// a pidfd where the kernel has them: a copy into a process that exited fails instead of reaching
// another process that reused its pid.
#pragma once

#include <memory>

#include "kvnode/common/result.hpp"
#include "kvnode/common/unique_fd.hpp"
#include "kvnode/gpu/segment_copy.hpp"

namespace kvnode::node::local {

// The engine process: its pid, and a pidfd on it (invalid where pidfd_open is missing).
struct EngineProcess {
  int pid = 0;
  UniqueFd pidfd{};
  // kPeerLost once the process exited.
  Status alive() const;
};

// Opens the process and reads one byte at `address` of it: kRefused when this node may not
// (ptrace permission), kInvalid when the address is not mapped there, kPeerLost when it is gone.
Result<EngineProcess> open_engine_process(int pid, std::uintptr_t address, const char* what);

// remote_source: the engine's memory is each segment's source (a store), else its destination.
std::unique_ptr<gpu::SegmentCopier> make_process_copier(const EngineProcess& engine,
                                                        bool remote_source);

}  // namespace kvnode::node::local
