#include "lanes.hpp"

#include <bit>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace kvnode::transfer {

EndpointLanes parse_lanes(const std::string& print_info) {
  EndpointLanes out;
  std::istringstream in(print_info);
  for (std::string line; std::getline(in, line);) {
    const auto lane = line.find("lane[");
    if (lane == std::string::npos) continue;
    // "lane[2]:  5:cma/memory.0 md[4] -> md[4]/cma/sysdev[255] rma_bw#0"
    const auto colon = line.find(':', lane);
    if (colon == std::string::npos) continue;
    const auto index_end = line.find(':', colon + 1);
    const auto slash = line.find('/', index_end == std::string::npos ? colon : index_end);
    if (index_end == std::string::npos || slash == std::string::npos) continue;
    const std::string transport = line.substr(index_end + 1, slash - index_end - 1);
    const std::string roles = line.substr(slash);
    if (out.rma_bw.empty() && roles.find(" rma_bw") != std::string::npos) out.rma_bw = transport;
    if (out.am_bw.empty() && roles.find(" am_bw") != std::string::npos) out.am_bw = transport;
  }
  return out;
}

EndpointLanes endpoint_lanes(ucp_ep_h ep) {
  char* text = nullptr;
  std::size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return {};
  ucp_ep_print_info(ep, stream);
  std::fclose(stream);
  std::string info(text, size);
  std::free(text);
  return parse_lanes(info);
}

bool rma_is_native(const EndpointLanes& lanes) {
  return !lanes.rma_bw.empty() && lanes.rma_bw != "tcp";
}

Status check_packed_rkey(const ucx::Bytes& rkey) {
  std::uint64_t md_map = 0;
  if (rkey.size() < sizeof(md_map) + 1) return make_error("rkey: shorter than its header");
  std::memcpy(&md_map, rkey.data(), sizeof(md_map));
  std::size_t at = sizeof(md_map) + 1;
  for (int i = 0; i < std::popcount(md_map); ++i) {
    if (at >= rkey.size()) return make_error("rkey: ends before its memory domain records");
    at += 1 + static_cast<std::size_t>(rkey[at]);
    if (at > rkey.size()) return make_error("rkey: a memory domain record runs past its end");
  }
  return {};
}

}  // namespace kvnode::transfer
