// Host copies that bypass the cache for their destination (non-temporal stores). A KV store or
// load moves far more bytes than the caches hold, in runs of 256 bytes to a few MiB; glibc's
// memcpy streams only copies past its non-temporal threshold (MiBs), so every smaller run reads
// its destination lines in before writing them (read-for-ownership) and evicts what the other
// copies need: 3 GB/s where one large memcpy reaches 10 on the same host.
#pragma once

#include <cstddef>

namespace kvnode::gpu {

// A batch of host copies at least this large streams its stores: past a server's per-core share
// of the last-level cache, where its destination would only evict what other copies need.
inline constexpr std::size_t kStreamCopyBytes = 8u << 20;

// Copies n bytes (regions must not overlap); x86-64: stores not kept in the cache, ordered by
// stream_fence(); elsewhere a memcpy.
void stream_copy(std::byte* dst, const std::byte* src, std::size_t n) noexcept;
// Orders the streaming stores before everything after it (x86 sfence): call once after a batch.
void stream_fence() noexcept;

}  // namespace kvnode::gpu
