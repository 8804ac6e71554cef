// KV shapes to chunk sizes (LMCache's KV_2LTD layout) and dtype names as torch and vLLM spell them.
#include "kvnode/gpu/kv_shape.hpp"

#include <gtest/gtest.h>

namespace kvnode::gpu {
namespace {

TEST(KvShape, Llama31_8BChunkIs32MiB) {
  const KvShape llama{.layers = 32,
                      .kv_heads = 8,
                      .head_size = 128,
                      .dtype = KvDtype::kBFloat16,
                      .tokens_per_chunk = 256};
  const auto bytes = chunk_bytes(llama);
  ASSERT_TRUE(bytes) << bytes.error().message;
  EXPECT_EQ(*bytes, 32u << 20);
  // Under TP 8 each rank holds one KV head: an eighth of the chunk.
  KvShape rank = llama;
  rank.kv_heads = 1;
  EXPECT_EQ(*chunk_bytes(rank), 4u << 20);
  // fp8 halves it, float32 doubles it.
  rank.dtype = KvDtype::kFloat8E4M3;
  EXPECT_EQ(*chunk_bytes(rank), 2u << 20);
  rank.dtype = KvDtype::kFloat32;
  EXPECT_EQ(*chunk_bytes(rank), 8u << 20);
}

TEST(KvShape, ZeroFieldsAndOverflowAreNamed) {
  KvShape s{.layers = 32,
            .kv_heads = 0,
            .head_size = 128,
            .dtype = KvDtype::kBFloat16,
            .tokens_per_chunk = 256};
  auto r = chunk_bytes(s);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("kv_heads"), std::string::npos);
  s = KvShape{.layers = 0xFFFFFFFF,
              .kv_heads = 0xFFFFFFFF,
              .head_size = 0xFFFFFFFF,
              .dtype = KvDtype::kFloat32,
              .tokens_per_chunk = 0xFFFFFFFF};
  r = chunk_bytes(s);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("overflows"), std::string::npos);
}

TEST(KvShape, DtypeNames) {
  EXPECT_EQ(*parse_dtype("torch.bfloat16"), KvDtype::kBFloat16);
  EXPECT_EQ(*parse_dtype("half"), KvDtype::kFloat16);
  EXPECT_EQ(*parse_dtype("FP8"), KvDtype::kFloat8E4M3);
  EXPECT_EQ(*parse_dtype("float8_e5m2"), KvDtype::kFloat8E5M2);
  EXPECT_EQ(to_string(KvDtype::kBFloat16), "bfloat16");
  EXPECT_EQ(dtype_bytes(KvDtype::kFloat32), 4u);
  const auto bad = parse_dtype("int4");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("'int4'"), std::string::npos);
  EXPECT_NE(bad.error().message.find("bfloat16"), std::string::npos);
}

}  // namespace
}  // namespace kvnode::gpu
