// The C API's questions about a prefix beyond this node: kvnode_lookup_peers (who holds how
// much, nothing moved) and kvnode_retrieve (pull what this node lacks), by tokens or (the
// *_chunks twins) by chunk hash. All are the local retrieve op, with and without its peek.
#include <string>
#include <vector>

#include "c_api/c_api.hpp"

namespace {

namespace kc = kvnode::client;
using kvnode::c_api::check_fields;
using kvnode::c_api::fail;
using kvnode::c_api::guarded;
using kvnode::c_api::invalid;
using kvnode::c_api::ok;

// Writes the fields the caller asked for (its mask checked already), no other byte.
void answer(kvnode_prefix_info_t* p, const kc::RetrieveReply& r) {
  const std::uint64_t want = p->field_mask;
  if (want & KVNODE_PREFIX_FIELD_TOKENS) p->tokens = r.tokens;
  if (want & KVNODE_PREFIX_FIELD_CHUNKS) p->chunks = r.chunks;
  if (want & KVNODE_PREFIX_FIELD_PULLED) p->pulled = r.pulled;
  if (want & KVNODE_PREFIX_FIELD_PEER_TOKENS) p->peer_tokens = r.peer_tokens;
  if (want & KVNODE_PREFIX_FIELD_PEER) kvnode::c_api::copy_cut(p->peer, sizeof p->peer, r.peer);
  if (want & KVNODE_PREFIX_FIELD_PEER_CHUNKS) p->peer_chunks = r.peer_chunks;
}

// `keys` are tokens, or chunk hashes when by_hash.
kvnode_status_t ask(std::string_view fn, kvnode_client_t* client, const int64_t* keys,
                    size_t num_keys, kvnode_prefix_info_t* prefix, bool pull, bool by_hash,
                    kvnode_error_t* err) {
  if (client == nullptr) return invalid(std::string(fn) + ": client is NULL", err);
  if (prefix == nullptr) return invalid(std::string(fn) + ": prefix is NULL", err);
  if (const kvnode_status_t s =
          check_fields(prefix->field_mask, KVNODE_PREFIX_FIELDS_ALL, fn, err, "prefix");
      s != KVNODE_OK)
    return s;
  answer(prefix, {});  // zeroes until the node answers
  if (keys == nullptr && num_keys > 0)
    return invalid(std::string(fn) + (by_hash ? ": hashes is NULL" : ": tokens is NULL"), err);
  std::vector<std::int64_t> values;
  if (num_keys > 0) values.assign(keys, keys + num_keys);
  const kc::ChunkKeys chunks = by_hash ? kc::ChunkKeys::of_hashes(std::move(values))
                                       : kc::ChunkKeys::of_tokens(std::move(values));
  auto reply = pull ? client->client->retrieve(chunks) : client->client->peek(chunks);
  if (!reply) return fail(reply.error(), err);
  answer(prefix, *reply);
  return ok(err);
}

}  // namespace

extern "C" kvnode_status_t kvnode_lookup_peers(kvnode_client_t* client, const int64_t* tokens,
                                               size_t num_tokens, kvnode_prefix_info_t* prefix,
                                               kvnode_error_t* err) {
  return guarded(err, [&] {
    return ask("kvnode_lookup_peers", client, tokens, num_tokens, prefix, false, false, err);
  });
}

extern "C" kvnode_status_t kvnode_retrieve(kvnode_client_t* client, const int64_t* tokens,
                                           size_t num_tokens, kvnode_prefix_info_t* prefix,
                                           kvnode_error_t* err) {
  return guarded(err, [&] {
    return ask("kvnode_retrieve", client, tokens, num_tokens, prefix, true, false, err);
  });
}

extern "C" kvnode_status_t kvnode_lookup_peers_chunks(kvnode_client_t* client,
                                                      const int64_t* hashes, size_t num_hashes,
                                                      kvnode_prefix_info_t* prefix,
                                                      kvnode_error_t* err) {
  return guarded(err, [&] {
    return ask("kvnode_lookup_peers_chunks", client, hashes, num_hashes, prefix, false, true, err);
  });
}

extern "C" kvnode_status_t kvnode_retrieve_chunks(kvnode_client_t* client, const int64_t* hashes,
                                                  size_t num_hashes, kvnode_prefix_info_t* prefix,
                                                  kvnode_error_t* err) {
  return guarded(err, [&] {
    return ask("kvnode_retrieve_chunks", client, hashes, num_hashes, prefix, true, true, err);
  });
}
