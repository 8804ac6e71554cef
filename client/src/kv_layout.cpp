// KvLayout's presets, validation and chunk size. Every product is checked: a descriptor comes from
// an engine (later over the local socket), and a huge stride must be refused, not wrapped.
#include "kvnode/client/kv_layout.hpp"

#include <initializer_list>
#include <optional>
#include <string>

namespace kvnode::client {
namespace {

// a * b, or nullopt when it does not fit in size_t.
std::optional<std::size_t> mul(std::size_t a, std::size_t b) {
  std::size_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
std::optional<std::size_t> add(std::size_t a, std::size_t b) {
  std::size_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
std::optional<std::size_t> product(std::initializer_list<std::size_t> factors) {
  std::optional<std::size_t> r = 1;
  for (std::size_t f : factors) {
    if (!r) return r;
    r = mul(*r, f);
  }
  return r;
}

Error overflow(const std::string& what) {
  return make_error(ErrorCode::kInvalid, what + ": size overflows");
}

Status check_shape(const KvCacheShape& s, bool mla) {
  if (s.num_blocks == 0) return make_error("shape.num_blocks: must be > 0");
  if (s.block_size == 0) return make_error("shape.block_size: must be > 0");
  if (!mla && s.kv_heads == 0) return make_error("shape.kv_heads: must be > 0");
  if (s.head_size == 0) return make_error("shape.head_size: must be > 0");
  if (s.elem_bytes == 0) return make_error("shape.elem_bytes: must be > 0");
  return {};
}

Status check_buffers(std::span<const KvBuffer> buffers, const char* name) {
  if (buffers.empty()) return make_error(std::string(name) + ": no layers given");
  return {};
}

KvTensor tensor_at(const KvBuffer& b, std::size_t extra_offset) {
  KvTensor t;
  t.base = b.base;
  t.allocation_bytes = b.allocation_bytes;
  t.offset = b.offset + extra_offset;  // checked by validate(): offset + extent fits the allocation
  return t;
}

// A preset's result, validated: buffers too small for the shape are refused here.
Result<KvLayout> finish(KvLayout layout) {
  if (Status st = validate(layout); !st) return st.error();
  return layout;
}

// Row bytes, token bytes (heads * row) and block bytes (block_size * token) of an NHD block.
struct NhdSizes {
  std::size_t row = 0;
  std::size_t token = 0;
  std::size_t block = 0;
  std::size_t tensor = 0;  // num_blocks * block
};
Result<NhdSizes> nhd_sizes(const KvCacheShape& s, std::uint32_t heads) {
  NhdSizes n;
  const auto row = mul(s.head_size, s.elem_bytes);
  const auto token = row ? mul(*row, heads) : std::nullopt;
  const auto block = token ? mul(*token, s.block_size) : std::nullopt;
  const auto tensor = block ? mul(*block, s.num_blocks) : std::nullopt;
  if (!tensor) return overflow("shape");
  n.row = *row;
  n.token = *token;
  n.block = *block;
  n.tensor = *tensor;
  return n;
}

KvLayout base_layout(const KvCacheShape& s, KvFormat format, std::uint32_t heads) {
  KvLayout l;
  l.format = format;
  l.num_blocks = s.num_blocks;
  l.block_size = s.block_size;
  l.kv_heads = heads;
  l.head_size = s.head_size;
  l.elem_bytes = s.elem_bytes;
  return l;
}

void set_strides(KvTensor& t, std::size_t block, std::size_t token, std::size_t head) {
  t.block_stride = block;
  t.token_stride = token;
  t.head_stride = head;
}

std::string tensor_name(std::size_t layer, bool v) {
  return "layers[" + std::to_string(layer) + "]." + (v ? "v" : "k");
}

Status validate_tensor(const KvLayout& l, const KvTensor& t, const std::string& name,
                       std::size_t row) {
  if (t.base == nullptr) return make_error(name + ".base: null");
  if (t.allocation_bytes == 0) return make_error(name + ".allocation_bytes: must be > 0");
  if (t.block_stride == 0) return make_error(name + ".block_stride: must be > 0");
  if (l.block_size > 1 && t.token_stride < row) {
    return make_error(name + ".token_stride: " + std::to_string(t.token_stride) +
                      " is less than a row of " + std::to_string(row) + " bytes");
  }
  if (l.kv_heads > 1 && t.head_stride < row) {
    return make_error(name + ".head_stride: " + std::to_string(t.head_stride) +
                      " is less than a row of " + std::to_string(row) + " bytes");
  }
  // The byte after the last row of the last head of the last token of the last block.
  const auto blocks = mul(l.num_blocks - 1, t.block_stride);
  if (!blocks) return overflow(name + ".block_stride");
  const auto tokens = mul(l.block_size - 1, t.token_stride);
  if (!tokens) return overflow(name + ".token_stride");
  const auto heads = mul(l.kv_heads - 1, t.head_stride);
  if (!heads) return overflow(name + ".head_stride");
  // Summed field by field, so an overflow names the field that caused it.
  std::optional<std::size_t> end = add(t.offset, *blocks);
  if (!end) return overflow(name + ".block_stride");
  end = add(*end, *tokens);
  if (!end) return overflow(name + ".token_stride");
  end = add(*end, *heads);
  if (!end) return overflow(name + ".head_stride");
  end = add(*end, row);
  if (!end) return overflow(name + ".offset");
  if (*end > t.allocation_bytes) {
    return make_error(name + ".block_stride: the last block ends at byte " + std::to_string(*end) +
                      " (offset " + std::to_string(t.offset) + " + extent " +
                      std::to_string(*end - t.offset) + "), past the allocation of " +
                      std::to_string(t.allocation_bytes) + " bytes");
  }
  return {};
}

}  // namespace

Result<KvLayout> vllm_flash_attn_layout(const KvCacheShape& shape,
                                        std::span<const KvBuffer> layers) {
  if (Status st = check_shape(shape, false); !st) return st.error();
  if (Status st = check_buffers(layers, "layers"); !st) return st.error();
  auto n = nhd_sizes(shape, shape.kv_heads);
  if (!n) return n.error();
  KvLayout l = base_layout(shape, KvFormat::kKeyValue, shape.kv_heads);
  for (const KvBuffer& b : layers) {
    KvLayerTensors lt{tensor_at(b, 0), tensor_at(b, n->tensor)};
    set_strides(lt.k, n->block, n->token, n->row);
    set_strides(lt.v, n->block, n->token, n->row);
    l.layers.push_back(lt);
  }
  return finish(std::move(l));
}

Result<KvLayout> flashinfer_layout(const KvCacheShape& shape, std::span<const KvBuffer> layers) {
  if (Status st = check_shape(shape, false); !st) return st.error();
  if (Status st = check_buffers(layers, "layers"); !st) return st.error();
  auto n = nhd_sizes(shape, shape.kv_heads);
  if (!n) return n.error();
  const auto block_stride = mul(n->block, 2);
  if (!block_stride || !mul(*block_stride, shape.num_blocks)) return overflow("shape");
  KvLayout l = base_layout(shape, KvFormat::kKeyValue, shape.kv_heads);
  for (const KvBuffer& b : layers) {
    KvLayerTensors lt{tensor_at(b, 0), tensor_at(b, n->block)};
    set_strides(lt.k, *block_stride, n->token, n->row);
    set_strides(lt.v, *block_stride, n->token, n->row);
    l.layers.push_back(lt);
  }
  return finish(std::move(l));
}

Result<KvLayout> mla_layout(const KvCacheShape& shape, std::span<const KvBuffer> layers) {
  if (Status st = check_shape(shape, true); !st) return st.error();
  if (Status st = check_buffers(layers, "layers"); !st) return st.error();
  auto n = nhd_sizes(shape, 1);
  if (!n) return n.error();
  KvLayout l = base_layout(shape, KvFormat::kMla, 1);
  for (const KvBuffer& b : layers) {
    KvLayerTensors lt{tensor_at(b, 0), KvTensor{}};
    set_strides(lt.k, n->block, n->token, n->row);
    l.layers.push_back(lt);
  }
  return finish(std::move(l));
}

Result<KvLayout> sglang_layout(const KvCacheShape& shape, std::span<const KvBuffer> k_layers,
                               std::span<const KvBuffer> v_layers) {
  if (Status st = check_shape(shape, false); !st) return st.error();
  if (Status st = check_buffers(k_layers, "k_layers"); !st) return st.error();
  if (k_layers.size() != v_layers.size()) {
    return make_error("v_layers: " + std::to_string(v_layers.size()) + " buffers for " +
                      std::to_string(k_layers.size()) + " K layers");
  }
  auto n = nhd_sizes(shape, shape.kv_heads);
  if (!n) return n.error();
  KvLayout l = base_layout(shape, KvFormat::kKeyValue, shape.kv_heads);
  for (std::size_t i = 0; i < k_layers.size(); ++i) {
    KvLayerTensors lt{tensor_at(k_layers[i], 0), tensor_at(v_layers[i], 0)};
    set_strides(lt.k, n->block, n->token, n->row);
    set_strides(lt.v, n->block, n->token, n->row);
    l.layers.push_back(lt);
  }
  return finish(std::move(l));
}

Result<KvLayout> strided_layout(const KvCacheShape& shape, KvFormat format,
                                const KvStrides& strides, std::span<const KvBuffer> layers) {
  const bool mla = format == KvFormat::kMla;
  if (Status st = check_shape(shape, mla); !st) return st.error();
  if (Status st = check_buffers(layers, "layers"); !st) return st.error();
  const std::uint32_t heads = mla ? 1 : shape.kv_heads;
  if (!mla && strides.v_offset == 0)
    return make_error("strides.v_offset: must be > 0 (V lies after K)");
  KvLayout l = base_layout(shape, format, heads);
  for (const KvBuffer& b : layers) {
    KvLayerTensors lt{tensor_at(b, 0), mla ? KvTensor{} : tensor_at(b, 0)};
    if (!mla) {
      const auto v = add(b.offset, strides.v_offset);
      if (!v) return overflow("strides.v_offset");
      lt.v.offset = *v;
      set_strides(lt.v, strides.block_stride, strides.token_stride, strides.head_stride);
    }
    set_strides(lt.k, strides.block_stride, strides.token_stride, strides.head_stride);
    l.layers.push_back(lt);
  }
  return finish(std::move(l));
}

Status validate(const KvLayout& l) {
  if (l.layers.empty()) return make_error("layers: empty");
  if (l.num_blocks == 0) return make_error("num_blocks: must be > 0");
  if (l.block_size == 0) return make_error("block_size: must be > 0");
  if (l.kv_heads == 0) return make_error("kv_heads: must be > 0");
  if (l.format == KvFormat::kMla && l.kv_heads != 1) {
    return make_error("kv_heads: " + std::to_string(l.kv_heads) + " for MLA, which has 1");
  }
  if (l.head_size == 0) return make_error("head_size: must be > 0");
  if (l.elem_bytes == 0) return make_error("elem_bytes: must be > 0");
  const auto row = mul(l.head_size, l.elem_bytes);
  if (!row) return overflow("head_size");
  const bool has_v = l.format == KvFormat::kKeyValue;
  for (std::size_t i = 0; i < l.layers.size(); ++i) {
    if (Status st = validate_tensor(l, l.layers[i].k, tensor_name(i, false), *row); !st) return st;
    if (!has_v) continue;
    if (Status st = validate_tensor(l, l.layers[i].v, tensor_name(i, true), *row); !st) return st;
  }
  return {};
}

Result<std::size_t> chunk_bytes(const KvLayout& l, std::size_t tokens) {
  if (tokens == 0) return make_error("tokens: must be > 0");
  if (l.layers.empty()) return make_error("layers: empty");
  if (l.kv_heads == 0 || l.head_size == 0 || l.elem_bytes == 0) {
    return make_error("kv_heads, head_size, elem_bytes: must be > 0");
  }
  const std::size_t kv = l.format == KvFormat::kMla ? 1 : 2;
  const auto bytes = product({kv, l.layers.size(), tokens, l.kv_heads, l.head_size, l.elem_bytes});
  if (!bytes) return overflow("chunk of " + std::to_string(tokens) + " tokens");
  return *bytes;
}

}  // namespace kvnode::client
