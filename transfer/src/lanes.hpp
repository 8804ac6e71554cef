// What UCX chose for an endpoint, read back from ucp_ep_print_info (UCX 1.13 has no query for
// it): the transport carrying bulk RMA, if any, and the one carrying active messages. The plane
// uses RMA only where a non-tcp transport carries it natively: over tcp UCX emulates RMA and
// large puts collapse to tens of MB/s (platform notes), so there active messages move the bytes.
#pragma once

#include <ucp/api/ucp.h>

#include <string>

#include "kvnode/common/result.hpp"
#include "ucx_handles.hpp"

namespace kvnode::transfer {

struct EndpointLanes {
  std::string rma_bw;  // e.g. "cma", "rc_mlx5"; empty when RMA would be emulated
  std::string am_bw;   // e.g. "tcp", "sysv"
};

EndpointLanes parse_lanes(const std::string& print_info);
EndpointLanes endpoint_lanes(ucp_ep_h ep);
bool rma_is_native(const EndpointLanes& lanes);

// A peer's packed rkey is handed to ucp_ep_rkey_unpack, which takes no length: check first that
// the bytes hold the records their own header announces (UCX 1.13 layout: a 64-bit md map, a
// memory type byte, then per md a size byte and that many bytes), so a hostile peer cannot make
// UCX read past them.
Status check_packed_rkey(const ucx::Bytes& rkey);

}  // namespace kvnode::transfer
