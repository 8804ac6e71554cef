// Process-wide allocator settings for the daemons (kvcontroller, kvnode); their mains call this
// once, before any thread starts.
#pragma once

#include <malloc.h>

#include <cstddef>
#include <cstdlib>

namespace kvnode {

// Requests carry token and chunk lists of 100 KB and more. By default glibc serves each from a
// fresh mmap and hands freed memory back to the kernel, so every request faults its pages in
// again; under virtualisation that cost more than parsing the request (a 16k-token /move: 4.0 ms
// -> 2.4 ms with this). Keep up to 64 MiB of freed memory per arena, mmap only above 32 MiB.
inline constexpr int kKeptFreeBytes = 64 << 20;
inline void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's ceiling for this setting
  mallopt(M_TRIM_THRESHOLD, kKeptFreeBytes);
}

// After a large request (a body of many MB): hands free heap back to the kernel, which the
// setting above would otherwise keep for good (8 parallel 12 MB /lookup bodies left 80 MB). In a
// thread's own arena glibc trims the free top only inside free() and only above the threshold,
// and malloc_trim skips it: so lower the threshold, free a block that joins the top, restore.
inline void release_freed_memory() {
  constexpr std::size_t kNudgeBytes = 256 << 10;  // above glibc's 64 KiB consolidation threshold
  mallopt(M_TRIM_THRESHOLD, 0);
  void* volatile nudge = malloc(kNudgeBytes);  // volatile: the pair must not be optimised away
  free(nudge);
  mallopt(M_TRIM_THRESHOLD, kKeptFreeBytes);
  malloc_trim(0);  // free chunks below the tops, and the main arena
}

}  // namespace kvnode
