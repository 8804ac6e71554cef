// The README's first C++ example ("The local client API"), verbatim down to the main below
// (tests/client/readme_examples.cmake checks it), built against the installed tree by
// tests/client/install_test.cmake and run with no node there: it must fail cleanly.
#include "kvnode/client/local_client.hpp"
using kvnode::client::ChunkKeys;

// Stores a prompt's KV chunks (what the engine computed, chunk after chunk), reads the stored
// prefix back, pulls what this node lacks from a peer, and asks by chunk hash.
kvnode::Status put_and_get(const std::string& socket, const std::vector<std::int64_t>& tokens) {
  auto client = kvnode::client::LocalClient::connect(socket);  // e.g. /tmp/kvnode-vllm-0.sock
  if (!client) return client.error();  // says why: no socket there, nothing listens, ...
  const kvnode::client::NodeInfo node = (*client)->info();
  // A chunk is node.chunk_size tokens; a last partial one is a chunk too if save_unfull_chunk.
  const std::size_t chunks = node.save_unfull_chunk
                                 ? (tokens.size() + node.chunk_size - 1) / node.chunk_size
                                 : tokens.size() / node.chunk_size;
  std::vector<std::byte> kv(chunks * node.chunk_bytes);  // chunk after chunk, a pool page each
  auto stored = (*client)->put(ChunkKeys::of_tokens(tokens), kv);  // hashed as LMCache does
  if (!stored) return stored.error();  // *stored: the leading chunks stored (fewer when full)
  auto held = (*client)->get(ChunkKeys::of_tokens(tokens), kv);  // the stored prefix, copied
  if (!held) return held.error();
  auto found = (*client)->retrieve(ChunkKeys::of_tokens(tokens));  // P2P: the rest from a peer
  if (!found) return found.error();
  auto hashes = (*client)->hashes(tokens);  // the chunk hashes, as the node computes them
  if (!hashes) return hashes.error();
  auto present = (*client)->contains(ChunkKeys::of_hashes(*hashes));  // or by chunk hash
  if (!present) return present.error();
  return {};
}

#include <cstdio>
#include <numeric>

int main(int argc, char** argv) {
  std::vector<std::int64_t> tokens(40);  // two 16-token chunks and 8 tokens more
  std::iota(tokens.begin(), tokens.end(), 1000);
  const kvnode::Status status =
      put_and_get(argc > 1 ? argv[1] : "/tmp/kvnode-example.sock", tokens);
  if (!status) {
    std::fprintf(stderr, "%s: %s\n", kvnode::to_string(status.error().code),
                 status.error().message.c_str());
    return 1;
  }
  std::puts("stored, read back, retrieved and found");
  return 0;
}
