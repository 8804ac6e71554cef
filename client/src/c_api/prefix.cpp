// The C API's questions about a prefix beyond this node: kvnode_lookup_peers (who holds how
// much, nothing moved) and kvnode_retrieve (pull what this node lacks). Both are the local
// retrieve op, with and without its peek.
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
}

kvnode_status_t ask(std::string_view fn, kvnode_client_t* client, const int64_t* tokens,
                    size_t num_tokens, kvnode_prefix_info_t* prefix, bool pull,
                    kvnode_error_t* err) {
  if (client == nullptr) return invalid(std::string(fn) + ": client is NULL", err);
  if (prefix == nullptr) return invalid(std::string(fn) + ": prefix is NULL", err);
  if (const kvnode_status_t s =
          check_fields(prefix->field_mask, KVNODE_PREFIX_FIELDS_ALL, fn, err, "prefix");
      s != KVNODE_OK)
    return s;
  answer(prefix, {});  // zeroes until the node answers
  if (tokens == nullptr && num_tokens > 0)
    return invalid(std::string(fn) + ": tokens is NULL", err);
  std::vector<std::int64_t> t;
  if (num_tokens > 0) t.assign(tokens, tokens + num_tokens);
  const kc::ChunkKeys keys = kc::ChunkKeys::of_tokens(std::move(t));
  auto reply = pull ? client->client->retrieve(keys) : client->client->peek(keys);
  if (!reply) return fail(reply.error(), err);
  answer(prefix, *reply);
  return ok(err);
}

}  // namespace

extern "C" kvnode_status_t kvnode_lookup_peers(kvnode_client_t* client, const int64_t* tokens,
                                               size_t num_tokens, kvnode_prefix_info_t* prefix,
                                               kvnode_error_t* err) {
  return guarded(err, [&] {
    return ask("kvnode_lookup_peers", client, tokens, num_tokens, prefix, false, err);
  });
}

extern "C" kvnode_status_t kvnode_retrieve(kvnode_client_t* client, const int64_t* tokens,
                                           size_t num_tokens, kvnode_prefix_info_t* prefix,
                                           kvnode_error_t* err) {
  return guarded(
      err, [&] { return ask("kvnode_retrieve", client, tokens, num_tokens, prefix, true, err); });
}
