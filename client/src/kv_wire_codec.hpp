// The msgpack form of a KvWireLayout inside a register_kv request: a map of the shape fields,
// "allocations" ([kind, bytes, handle-or-nil] each) and "tensors" ([allocation, offset,
// block_stride, token_stride, head_stride] each). Private to the client library.
#pragma once

#include <msgpack.hpp>
#include <string>

#include "kvnode/client/kv_wire.hpp"
#include "msgpack_fields.hpp"

namespace kvnode::client::protocol::detail {

void pack_kv_layout(Packer& pk, const KvWireLayout& layout);
Status read_kv_layout(const msgpack::object& v, const std::string& path, KvWireLayout& out);

}  // namespace kvnode::client::protocol::detail
