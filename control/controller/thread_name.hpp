// Controller threads name themselves after their job, so `top -H` and `perf` show operators which
// one is busy (docs/operations.md lists them).
#pragma once

#include <pthread.h>

namespace kvnode::controller {

// At most 15 characters (the kernel refuses longer ones). Threads started afterwards by this one
// inherit the name.
inline void name_this_thread(const char* name) {
  pthread_setname_np(pthread_self(), name);
}

}  // namespace kvnode::controller
