// KvLayout: every preset round-trips a paged cache through KV_2LTD chunks, checked byte by byte
// against addresses computed from the engine's documented tensor shape (not from the layout's
// strides, so a wrong preset stride fails); validation names the field; huge values are refused.
#include "kvnode/client/kv_layout.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace kc = kvnode::client;

namespace {

constexpr std::size_t kLayers = 3;
constexpr std::uint32_t kBlocks = 20;
constexpr std::uint32_t kBlockSize = 6;  // chunks of 16 tokens start inside blocks
constexpr std::uint32_t kHeads = 2;
constexpr std::uint32_t kHeadSize = 8;
constexpr std::uint32_t kElem = 2;
constexpr std::size_t kRow = std::size_t{kHeadSize} * kElem;
constexpr std::size_t kPad = 64;  // the tensor's offset in its allocation
constexpr std::size_t kSeqBlocks = 7;
constexpr std::size_t kSeqTokens = kSeqBlocks * kBlockSize;  // 42: chunks of 16, 16 and 10
constexpr std::size_t kChunk = 16;

std::byte pattern(std::size_t layer, std::size_t kv, std::size_t token, std::size_t head,
                  std::size_t byte) {
  std::uint64_t x = ((((layer * 2 + kv) * 1024 + token) * 64 + head) * 256 + byte);
  x = (x + 0x9e3779b97f4a7c15ULL) * 0xbf58476d1ce4e5b9ULL;
  return static_cast<std::byte>((x >> 56) | 1);  // never 0: a zeroed byte is always a miss
}

// A paged cache in host memory, with the address of (layer, kv, block, token, head) taken from
// the engine's own tensor shape.
struct Cache {
  std::vector<std::vector<std::byte>> allocs{};
  kc::KvLayout layout{};
  std::size_t kv_count = 2;
  std::size_t heads = kHeads;
  std::function<std::byte*(std::size_t, std::size_t, std::size_t, std::size_t, std::size_t)> at{};
};

kc::KvCacheShape shape() {
  return {kBlocks, kBlockSize, kHeads, kHeadSize, kElem};
}

std::vector<kc::KvBuffer> buffers(std::vector<std::vector<std::byte>>& allocs, std::size_t first,
                                  std::size_t step) {
  std::vector<kc::KvBuffer> out;
  for (std::size_t i = first; i < allocs.size(); i += step) {
    out.push_back({allocs[i].data(), allocs[i].size(), kPad});
  }
  return out;
}

// The allocations' data pointers, which stay put when a Cache moves.
std::vector<std::byte*> bases(Cache& c) {
  std::vector<std::byte*> out;
  for (auto& a : c.allocs) out.push_back(a.data());
  return out;
}

void alloc(Cache& c, std::size_t count, std::size_t tensor_bytes) {
  for (std::size_t i = 0; i < count; ++i) c.allocs.emplace_back(kPad + tensor_bytes + 32);
}

// vLLM FlashAttention: [2, num_blocks, block_size, num_kv_heads, head_size] per layer.
Cache vllm() {
  Cache c;
  alloc(c, kLayers, 2 * kBlocks * kBlockSize * kHeads * kRow);
  c.layout = kc::vllm_flash_attn_layout(shape(), buffers(c.allocs, 0, 1)).value();
  c.at = [a = bases(c)](std::size_t l, std::size_t kv, std::size_t b, std::size_t t,
                        std::size_t h) {
    return a[l] + kPad + (((kv * kBlocks + b) * kBlockSize + t) * kHeads + h) * kRow;
  };
  return c;
}

// FlashInfer: [num_blocks, 2, block_size, num_kv_heads, head_size].
Cache flashinfer() {
  Cache c;
  alloc(c, kLayers, 2 * kBlocks * kBlockSize * kHeads * kRow);
  c.layout = kc::flashinfer_layout(shape(), buffers(c.allocs, 0, 1)).value();
  c.at = [a = bases(c)](std::size_t l, std::size_t kv, std::size_t b, std::size_t t,
                        std::size_t h) {
    return a[l] + kPad + (((b * 2 + kv) * kBlockSize + t) * kHeads + h) * kRow;
  };
  return c;
}

// MLA: [num_blocks, block_size, head_size], one tensor.
Cache mla() {
  Cache c;
  c.kv_count = 1;
  c.heads = 1;
  alloc(c, kLayers, kBlocks * kBlockSize * kRow);
  c.layout = kc::mla_layout(shape(), buffers(c.allocs, 0, 1)).value();
  c.at = [a = bases(c)](std::size_t l, std::size_t, std::size_t b, std::size_t t, std::size_t) {
    return a[l] + kPad + (b * kBlockSize + t) * kRow;
  };
  return c;
}

// SGLang: K and V buffers per layer, [num_blocks * block_size slots, num_kv_heads, head_size].
Cache sglang() {
  Cache c;
  alloc(c, 2 * kLayers, kBlocks * kBlockSize * kHeads * kRow);  // k0 v0 k1 v1 ...
  c.layout = kc::sglang_layout(shape(), buffers(c.allocs, 0, 2), buffers(c.allocs, 1, 2)).value();
  c.at = [a = bases(c)](std::size_t l, std::size_t kv, std::size_t b, std::size_t t,
                        std::size_t h) {
    return a[2 * l + kv] + kPad + ((b * kBlockSize + t) * kHeads + h) * kRow;
  };
  return c;
}

// vLLM with an HND cache, [2, num_blocks, num_kv_heads, block_size, head_size]: by strides only.
Cache hnd() {
  Cache c;
  const std::size_t tensor = kBlocks * kHeads * kBlockSize * kRow;
  alloc(c, kLayers, 2 * tensor);
  c.layout.num_blocks = kBlocks;
  c.layout.block_size = kBlockSize;
  c.layout.kv_heads = kHeads;
  c.layout.head_size = kHeadSize;
  c.layout.elem_bytes = kElem;
  for (auto& a : c.allocs) {
    kc::KvTensor k{a.data(), a.size(), kPad, kHeads * kBlockSize * kRow, kRow, kBlockSize * kRow};
    kc::KvTensor v = k;
    v.offset = kPad + tensor;
    c.layout.layers.push_back({k, v});
  }
  c.at = [a = bases(c)](std::size_t l, std::size_t kv, std::size_t b, std::size_t t,
                        std::size_t h) {
    return a[l] + kPad + (((kv * kBlocks + b) * kHeads + h) * kBlockSize + t) * kRow;
  };
  return c;
}

// vLLM >= 0.33: one allocation, each layer a view [num_blocks, kv_heads, block_size,
// 2 * head_size] (K then V in the last axis) whose physical order is `order`, a permutation of
// L (layer), B (block), N (token), H (head) ending in C (channel); `mla`: [num_blocks, 1,
// block_size, head_size] views, no V.
Cache strided(const std::string& order, bool mla) {
  Cache c;
  c.kv_count = mla ? 1 : 2;
  c.heads = mla ? 1 : kHeads;
  const std::size_t channels = c.kv_count * kHeadSize;
  auto extent = [&](char dim) -> std::size_t {
    switch (dim) {
      case 'L':
        return kLayers;
      case 'B':
        return kBlocks;
      case 'N':
        return kBlockSize;
      case 'H':
        return c.heads;
      default:
        return channels;
    }
  };
  std::map<char, std::size_t> stride;  // bytes, row-major over `order`
  std::size_t step = kElem;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    stride[*it] = step;
    step *= extent(*it);
  }
  c.allocs.emplace_back(kPad + step + 32);
  std::vector<kc::KvBuffer> layers;
  for (std::size_t l = 0; l < kLayers; ++l)
    layers.push_back({c.allocs[0].data(), c.allocs[0].size(), kPad + l * stride['L']});
  const kc::KvStrides s{stride['B'], stride['N'], stride['H'], kHeadSize * kElem};
  auto layout =
      kc::strided_layout(shape(), mla ? kc::KvFormat::kMla : kc::KvFormat::kKeyValue, s, layers);
  EXPECT_TRUE(layout.ok()) << order << ": " << layout.error().message;
  if (layout) c.layout = std::move(layout).value();
  c.at = [a = c.allocs[0].data(), stride](std::size_t l, std::size_t kv, std::size_t b,
                                          std::size_t t, std::size_t h) {
    return a + kPad + l * stride.at('L') + b * stride.at('B') + t * stride.at('N') +
           h * stride.at('H') + kv * kHeadSize * kElem;
  };
  return c;
}

void fill(Cache& c, const std::vector<std::uint32_t>& table, std::size_t tokens) {
  for (std::size_t l = 0; l < kLayers; ++l) {
    for (std::size_t kv = 0; kv < c.kv_count; ++kv) {
      for (std::size_t t = 0; t < tokens; ++t) {
        for (std::size_t h = 0; h < c.heads; ++h) {
          std::byte* p = c.at(l, kv, table[t / kBlockSize], t % kBlockSize, h);
          for (std::size_t i = 0; i < kRow; ++i) p[i] = pattern(l, kv, t, h, i);
        }
      }
    }
  }
}

void zero(Cache& c) {
  for (auto& a : c.allocs) std::fill(a.begin(), a.end(), std::byte{0});
}

// Gathers the sequence in chunks, checks each chunk's KV_2LTD bytes, zeroes the cache, scatters
// into other blocks and checks every byte of every allocation.
void round_trip(Cache& c) {
  ASSERT_TRUE(kc::validate(c.layout).ok());
  std::vector<std::uint32_t> perm(kBlocks);
  std::iota(perm.begin(), perm.end(), 0u);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(42));
  const std::vector<std::uint32_t> table(perm.begin(), perm.begin() + kSeqBlocks);
  const std::vector<std::uint32_t> other(perm.begin() + kSeqBlocks, perm.begin() + 2 * kSeqBlocks);
  for (auto& a : c.allocs) std::fill(a.begin(), a.end(), std::byte{0xEE});
  fill(c, table, kSeqTokens);

  std::vector<std::vector<std::byte>> chunks;
  for (std::size_t first = 0; first < kSeqTokens; first += kChunk) {
    const std::size_t n = std::min(kChunk, kSeqTokens - first);
    const std::size_t bytes = c.kv_count * kLayers * n * c.heads * kRow;
    ASSERT_EQ(kc::chunk_bytes(c.layout, n).value(), bytes);
    std::vector<std::byte> out(bytes);
    const auto st = kc::gather(c.layout, table, first, n, out);
    ASSERT_TRUE(st.ok()) << st.error().message;
    std::size_t bad = 0;
    for (std::size_t kv = 0; kv < c.kv_count; ++kv) {
      for (std::size_t l = 0; l < kLayers; ++l) {
        for (std::size_t t = 0; t < n; ++t) {
          for (std::size_t h = 0; h < c.heads; ++h) {
            for (std::size_t i = 0; i < kRow; ++i) {
              const std::size_t pos = ((kv * kLayers + l) * n + t) * c.heads * kRow + h * kRow + i;
              bad += out[pos] != pattern(l, kv, first + t, h, i);
            }
          }
        }
      }
    }
    EXPECT_EQ(bad, 0u) << "chunk at token " << first;
    chunks.push_back(std::move(out));
  }

  zero(c);
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    const std::size_t first = k * kChunk;
    const std::size_t n = std::min(kChunk, kSeqTokens - first);
    const auto st = kc::scatter(c.layout, other, first, n, chunks[k]);
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  const auto got = c.allocs;
  zero(c);
  fill(c, other, kSeqTokens);
  for (std::size_t a = 0; a < got.size(); ++a) {
    std::size_t bad = 0;
    for (std::size_t i = 0; i < got[a].size(); ++i) bad += got[a][i] != c.allocs[a][i];
    EXPECT_EQ(bad, 0u) << "allocation " << a;
  }
}

std::string gather_error(const kc::KvLayout& l, const std::vector<std::uint32_t>& table,
                         std::size_t first, std::size_t tokens, std::size_t out_bytes) {
  std::vector<std::byte> out(out_bytes, std::byte{0x5A});
  const auto st = kc::gather(l, table, first, tokens, out);
  if (st.ok()) return "(ok)";
  EXPECT_EQ(st.error().code, kvnode::ErrorCode::kInvalid);
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0x5A}; }))
      << "a refused gather wrote bytes";
  return st.error().message;
}

std::string validate_error(const kc::KvLayout& l) {
  const auto st = kc::validate(l);
  return st.ok() ? "(ok)" : st.error().message;
}

}  // namespace

TEST(KvLayout, VllmFlashAttnRoundTrips) {
  Cache c = vllm();
  round_trip(c);
}

TEST(KvLayout, FlashInferRoundTrips) {
  Cache c = flashinfer();
  round_trip(c);
}

TEST(KvLayout, MlaRoundTrips) {
  Cache c = mla();
  EXPECT_EQ(c.layout.kv_heads, 1u);
  round_trip(c);
}

TEST(KvLayout, SglangSplitBuffersRoundTrip) {
  Cache c = sglang();
  EXPECT_EQ(c.layout.layers[0].k.block_stride, kBlockSize * c.layout.layers[0].k.token_stride);
  round_trip(c);
}

TEST(KvLayout, HndByStridesRoundTrips) {
  Cache c = hnd();
  round_trip(c);
}

// Every KVCacheLayout vLLM 0.33 can choose (kv_cache_layout.py), by strides alone.
TEST(KvLayout, VllmPackedViewsRoundTripInEveryPhysicalOrder) {
  for (const char* order : {"LBNHC", "LBHNC", "BLNHC", "LHBNC", "BLHNC", "BHLNC"}) {
    SCOPED_TRACE(order);
    Cache c = strided(order, false);
    round_trip(c);
  }
}

TEST(KvLayout, VllmPackedMlaRoundTrips) {
  for (const char* order : {"LBNHC", "BLNHC"}) {
    SCOPED_TRACE(order);
    Cache c = strided(order, true);
    EXPECT_EQ(c.layout.kv_heads, 1u);
    round_trip(c);
  }
}

TEST(KvLayout, StridedLayoutRefusesWhatDoesNotFit) {
  std::vector<std::byte> a(4096);
  const std::vector<kc::KvBuffer> one{{a.data(), a.size(), 0}};
  const kc::KvStrides fits{kBlockSize * kHeads * 2 * kRow, kHeads * 2 * kRow, 2 * kRow, kRow};
  auto no_v = fits;
  no_v.v_offset = 0;
  auto err = kc::strided_layout(shape(), kc::KvFormat::kKeyValue, no_v, one);
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.error().message.rfind("strides.v_offset:", 0), 0u) << err.error().message;
  // 20 blocks of 384 bytes leave a 4096-byte allocation: the message says where the end fell.
  err = kc::strided_layout(shape(), kc::KvFormat::kKeyValue, fits, one);
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.error().message.find("past the allocation of 4096 bytes"), std::string::npos)
      << err.error().message;
  std::vector<std::byte> big(8192);  // K fits; V's offset wraps
  const std::vector<kc::KvBuffer> roomy{{big.data(), big.size(), 0}};
  ASSERT_TRUE(kc::strided_layout(shape(), kc::KvFormat::kKeyValue, fits, roomy).ok());
  auto huge = fits;
  huge.v_offset = SIZE_MAX - 8;
  err = kc::strided_layout(shape(), kc::KvFormat::kKeyValue, huge, roomy);
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.error().message.find("overflows"), std::string::npos) << err.error().message;
}

TEST(KvLayout, UnfullLastChunkIsSizedByItsTokens) {
  Cache c = vllm();
  const std::vector<std::uint32_t> table{3, 9, 1, 17, 0, 5, 12};
  const std::size_t full = 2 * kLayers * kChunk * kHeads * kRow;
  const std::size_t unfull = 2 * kLayers * 10 * kHeads * kRow;
  EXPECT_EQ(gather_error(c.layout, table, 32, 10, unfull), "(ok)");
  const std::string err = gather_error(c.layout, table, 32, 10, full);
  EXPECT_NE(err.find("out: " + std::to_string(full) + " bytes"), std::string::npos) << err;
  EXPECT_NE(err.find("takes " + std::to_string(unfull) + " bytes"), std::string::npos) << err;
  // One token more than the table holds.
  const std::string past = gather_error(c.layout, table, 32, 11, unfull + unfull / 10);
  EXPECT_NE(past.find("past the 42 tokens of 7 blocks"), std::string::npos) << past;
}

TEST(KvLayout, ChunkBytesMatchesGpuKvShapeForLlama8B) {
  // gpu::chunk_bytes({32 layers, 8 heads, 128, bf16, 256}) = 2 * 32 * 256 * 8 * 128 * 2 = 32 MiB.
  kc::KvLayout l;
  l.layers.resize(32);
  l.kv_heads = 8;
  l.head_size = 128;
  l.elem_bytes = 2;
  EXPECT_EQ(kc::chunk_bytes(l, 256).value(), std::size_t{32} << 20);
  l.format = kc::KvFormat::kMla;  // 1LTD: [1, layers, tokens, head_size]
  l.kv_heads = 1;
  l.head_size = 576;
  EXPECT_EQ(kc::chunk_bytes(l, 256).value(), std::size_t{32} * 256 * 576 * 2);
  EXPECT_FALSE(kc::chunk_bytes(l, 0).ok());
}

TEST(KvLayout, ValidationNamesTheField) {
  const Cache c = vllm();
  auto with = [&](auto edit) {
    kc::KvLayout l = c.layout;
    edit(l);
    return validate_error(l);
  };
  EXPECT_EQ(with([](kc::KvLayout& l) { l.layers.clear(); }).rfind("layers:", 0), 0u);
  EXPECT_EQ(with([](kc::KvLayout& l) { l.num_blocks = 0; }).rfind("num_blocks:", 0), 0u);
  EXPECT_EQ(with([](kc::KvLayout& l) { l.block_size = 0; }).rfind("block_size:", 0), 0u);
  EXPECT_EQ(with([](kc::KvLayout& l) { l.kv_heads = 0; }).rfind("kv_heads:", 0), 0u);
  EXPECT_EQ(with([](kc::KvLayout& l) { l.head_size = 0; }).rfind("head_size:", 0), 0u);
  EXPECT_EQ(with([](kc::KvLayout& l) { l.elem_bytes = 0; }).rfind("elem_bytes:", 0), 0u);
  EXPECT_EQ(with([](kc::KvLayout& l) { l.layers[1].k.base = nullptr; }), "layers[1].k.base: null");
  EXPECT_EQ(with([](kc::KvLayout& l) {
              l.layers[2].v.block_stride = 0;
            }).rfind("layers[2].v.block_stride:", 0),
            0u);
  EXPECT_EQ(with([](kc::KvLayout& l) {
              l.layers[0].k.token_stride = kRow - 1;
            }).rfind("layers[0].k.token_stride: 15 is less than a row of 16 bytes", 0),
            0u);
  EXPECT_EQ(with([](kc::KvLayout& l) {
              l.layers[0].v.head_stride = 0;
            }).rfind("layers[0].v.head_stride:", 0),
            0u);
  // V's last block one byte past its allocation: both numbers named.
  const std::size_t size = c.layout.layers[2].v.allocation_bytes;
  const std::string past = with([](kc::KvLayout& l) { l.layers[2].v.offset += 33; });
  EXPECT_EQ(past.rfind("layers[2].v.block_stride:", 0), 0u) << past;
  EXPECT_NE(past.find("ends at byte " + std::to_string(size + 1)), std::string::npos) << past;
  EXPECT_NE(past.find("allocation of " + std::to_string(size) + " bytes"), std::string::npos)
      << past;
  EXPECT_EQ(with([](kc::KvLayout& l) { l.layers[2].v.offset += 32; }), "(ok)");
  EXPECT_EQ(
      with([](kc::KvLayout& l) { l.format = kc::KvFormat::kMla; }).rfind("kv_heads: 2 for MLA", 0),
      0u);
  // A preset refuses buffers too small for the shape.
  std::vector<std::byte> small(100);
  const std::vector<kc::KvBuffer> bufs{{small.data(), small.size(), 0}};
  const auto bad = kc::flashinfer_layout(shape(), bufs);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("layers[0].k.block_stride:", 0), 0u) << bad.error().message;
}

TEST(KvLayout, GatherAndScatterRefuseBadRequests) {
  Cache c = sglang();
  const std::vector<std::uint32_t> table{3, 9, 1, kBlocks, 0};
  const std::size_t bytes = 2 * kLayers * kChunk * kHeads * kRow;
  // Tokens 0..15 cover blocks 0..2: fine; 16..29 reach block_ids[3].
  EXPECT_EQ(gather_error(c.layout, table, 0, kChunk, bytes), "(ok)");
  EXPECT_EQ(gather_error(c.layout, table, kChunk, 14, 2 * kLayers * 14 * kHeads * kRow),
            "block_ids[3]: 20 is out of range (num_blocks 20)");
  std::vector<std::byte> in(bytes - 1);
  const auto st = kc::scatter(c.layout, table, 0, kChunk, in);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message, "in: " + std::to_string(bytes - 1) +
                                    " bytes, but a chunk of 16 tokens takes " +
                                    std::to_string(bytes) + " bytes");
  EXPECT_EQ(gather_error(c.layout, table, 0, 0, 0), "tokens: must be > 0");
  kc::KvLayout broken = c.layout;
  broken.layers[1].v.base = nullptr;
  EXPECT_EQ(gather_error(broken, table, 0, kChunk, bytes), "layout: layers[1].v.base: null");
}

TEST(KvLayout, HugeStridesAreRefusedNotWrapped) {
  Cache c = vllm();
  // 19 * (2^64 / 19 + 1) wraps to a small number that would fit the allocation.
  kc::KvLayout l = c.layout;
  l.layers[0].k.block_stride = SIZE_MAX / (kBlocks - 1) + 1;
  EXPECT_EQ(validate_error(l), "layers[0].k.block_stride: size overflows");
  l = c.layout;
  l.layers[1].v.head_stride = SIZE_MAX;
  EXPECT_EQ(validate_error(l), "layers[1].v.head_stride: size overflows");
  l = c.layout;
  l.layers[1].v.offset = SIZE_MAX - 8;  // offset + extent wraps
  EXPECT_EQ(validate_error(l), "layers[1].v.block_stride: size overflows");
  EXPECT_EQ(kc::chunk_bytes(c.layout, SIZE_MAX / 4).error().message,
            "chunk of " + std::to_string(SIZE_MAX / 4) + " tokens: size overflows");
  const kc::KvCacheShape huge{0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 8};
  const auto preset = kc::vllm_flash_attn_layout(huge, std::vector<kc::KvBuffer>{{}});
  ASSERT_FALSE(preset.ok());
  EXPECT_EQ(preset.error().message, "shape: size overflows");
}
