// Faulting memory in before it is used: a first touch inside a transfer costs far more than at
// start (measured on these VMs: cma into fresh pages ran at a tenth of its speed). One function
// for fresh pools (memory_region.cpp) and for a peer's mapped pool (region_share.cpp).
#pragma once

#include <cstddef>

#include "kvnode/common/result.hpp"

namespace kvnode::gpu {

// Faults every page of [p, p + bytes) in, writable. MADV_POPULATE_WRITE (Linux 5.14+) keeps the
// huge pages asked for; where the kernel lacks it (EINVAL) each page gets an atomic no-op write,
// safe while another process writes the same bytes. Any other failure (no memory, a poisoned
// page) would fault in the touch too, so it is returned instead.
Status fault_in(void* p, std::size_t bytes);

}  // namespace kvnode::gpu
