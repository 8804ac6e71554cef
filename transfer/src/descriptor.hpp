// What a node tells a peer in the handshake: how to reach its worker and where its chunk pool
// is. Encoded as a msgpack map; decoding treats the bytes as hostile (they come off the network):
// every field is type- and size-checked and an error names the field.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvnode/common/result.hpp"
#include "ucx_handles.hpp"

namespace kvnode::transfer {

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
  std::array<std::byte, 16> share_token{};
  std::uint8_t pool_kind = 0;  // gpu::MemoryKind of the pool
  std::uint32_t device = 0;    // its CUDA device, for a device pool
};

// A refusal sent in place of a descriptor; decode_descriptor reports it as an error.
ucx::Bytes encode_refusal(const std::string& reason);

// This machine's boot id (changes on reboot; shared by all processes of one boot).
std::string host_identity();

ucx::Bytes encode(const PeerDescriptor& descriptor);
Result<PeerDescriptor> decode_descriptor(const ucx::Bytes& bytes);

}  // namespace kvnode::transfer
