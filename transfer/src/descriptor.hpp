// What a node tells a peer in the handshake: how to reach its worker and where its chunk pool
// is. Encoded as a msgpack map; decoding treats the bytes as hostile (they come off the network):
// every field is type- and size-checked and an error names the field.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvnode/common/result.hpp"
#include "ucx_handles.hpp"

namespace kvnode::transfer {

// A pool share (pool_share.hpp): its token, and the prefix of every share socket's name (a
// descriptor naming any other socket is refused: a peer must not make us dial just any one).
using ShareToken = std::array<std::byte, 16>;
inline constexpr std::string_view kShareNamePrefix = "kvnode-pool-";

struct PeerDescriptor {
  std::string node;           // who this is, for logs (e.g. the peer_init_url)
  ucx::Bytes worker_address;  // for ucx::Endpoint::connect
  ucx::Bytes rkey;            // the pool's packed rkey
  std::uint64_t base = 0;     // the pool's first byte in the peer's address space
  std::uint64_t page_bytes = 0;
  std::uint32_t pages = 0;
  std::string host;            // this boot of this machine: peers on the same host may use shm
  std::uint64_t instance = 0;  // this process's incarnation, so a restarted peer is told apart
  // False when the pool is not open to one-sided access (device memory staged through host
  // memory): peers then move its chunks with active messages, one page per run.
  bool rma = true;
  // Same-host moves (pool_share.hpp): the abstract socket where this pool is handed out and the
  // token a client proves itself with; empty when the pool is not offered.
  std::string share;
  ShareToken share_token{};
  std::uint8_t pool_kind = 0;  // gpu::MemoryKind of the pool
  std::uint32_t device = 0;    // its CUDA device, for a device pool
};

// `d` without its pool share: for a descriptor going anywhere but to a same-host peer that
// dialled us, which alone may learn where our pool is handed out and the token.
inline PeerDescriptor without_share(PeerDescriptor d) {
  d.share.clear();
  d.share_token = {};
  return d;
}

// A refusal sent in place of a descriptor; decode_descriptor reports it as an error.
ucx::Bytes encode_refusal(const std::string& reason);

// This machine's boot id (changes on reboot; shared by all processes of one boot).
std::string host_identity();

ucx::Bytes encode(const PeerDescriptor& descriptor);
Result<PeerDescriptor> decode_descriptor(const ucx::Bytes& bytes);

}  // namespace kvnode::transfer
