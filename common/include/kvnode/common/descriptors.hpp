// The process's descriptor limit, raised once in main() before anything sizes itself from it (the
// HTTP connection cap, the transfer listener's pending cap): every connection is a descriptor,
// and the default soft limit (1024) is below a thousand idle clients plus the daemon's own.
#pragma once

#include <sys/resource.h>

namespace kvnode {

// Raises the soft RLIMIT_NOFILE to the hard one; returns the soft limit now in force (0 unknown).
inline rlim_t raise_descriptor_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return 0;
  if (r.rlim_cur < r.rlim_max) {
    rlimit raised = r;
    raised.rlim_cur = r.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) return raised.rlim_cur;
  }
  return r.rlim_cur;
}

}  // namespace kvnode
