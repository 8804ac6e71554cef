// CacheEngineKey strings (protocol reference §5.2): formatting, parsing, round trips, and every
// malformed-input path returning an error that names the part.
#include "kvnode/keys/cache_engine_key.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <ostream>
#include <string>

namespace kvnode::wire {
inline void PrintTo(const WideInt& v, std::ostream* os) {
  *os << v.to_string();
}
}  // namespace kvnode::wire

namespace kvnode::keys {

void PrintTo(const CacheEngineKey& k, std::ostream* os) {
  *os << k.to_string();
}

namespace {

using wire::WideInt;
constexpr std::int64_t kInt64Min = std::numeric_limits<std::int64_t>::min();
constexpr std::uint64_t kUint64Max = std::numeric_limits<std::uint64_t>::max();

CacheEngineKey example() {
  CacheEngineKey k;
  k.model_name = "Qwen/Qwen3-8B";
  k.world_size = 2;
  k.worker_id = 1;
  k.chunk_hash = -7693565463539782743;
  k.dtype = "bfloat16";
  return k;
}

// The error message of a parse that must fail.
std::string parse_error(std::string_view text) {
  const auto r = parse_cache_engine_key(text);
  EXPECT_FALSE(r.ok()) << "parsed: " << text;
  return r.ok() ? std::string() : r.error().message;
}

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(ChunkHashHex, Format) {
  EXPECT_EQ(format_chunk_hash_hex(0), "0");
  EXPECT_EQ(format_chunk_hash_hex(255), "ff");
  EXPECT_EQ(format_chunk_hash_hex(-1), "-1");
  EXPECT_EQ(format_chunk_hash_hex(-7693565463539782743), "-6ac50906de809457");
  EXPECT_EQ(format_chunk_hash_hex(2055708856580048389), "1c8758503e140605");
  EXPECT_EQ(format_chunk_hash_hex(kInt64Min), "-8000000000000000");
  EXPECT_EQ(format_chunk_hash_hex(WideInt::from_unsigned(kUint64Max)), "ffffffffffffffff");
}

TEST(ChunkHashHex, ParseWholeRange) {
  EXPECT_EQ(*parse_chunk_hash_hex("0"), WideInt(0));
  EXPECT_EQ(*parse_chunk_hash_hex("-0"), WideInt(0));
  EXPECT_EQ(*parse_chunk_hash_hex("-6ac50906de809457"), WideInt(-7693565463539782743));
  EXPECT_EQ(*parse_chunk_hash_hex("-6AC50906DE809457"), WideInt(-7693565463539782743));
  EXPECT_EQ(*parse_chunk_hash_hex("-8000000000000000"), WideInt(kInt64Min));
  EXPECT_EQ(*parse_chunk_hash_hex("7fffffffffffffff"),
            WideInt(std::numeric_limits<std::int64_t>::max()));
  EXPECT_EQ(*parse_chunk_hash_hex("8000000000000000"),
            WideInt::from_unsigned(std::uint64_t{1} << 63));
  EXPECT_EQ(*parse_chunk_hash_hex("ffffffffffffffff"), WideInt::from_unsigned(kUint64Max));
  EXPECT_EQ(*parse_chunk_hash_hex("0000000000000000000000ff"), WideInt(255));
}

TEST(ChunkHashHex, RoundTrip) {
  for (const WideInt v :
       {WideInt(0), WideInt(1), WideInt(-1), WideInt(kInt64Min),
        WideInt(std::numeric_limits<std::int64_t>::max()), WideInt::from_unsigned(kUint64Max),
        WideInt::from_unsigned(std::uint64_t{1} << 63)}) {
    const auto back = parse_chunk_hash_hex(format_chunk_hash_hex(v));
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(*back, v);
  }
}

TEST(ChunkHashHex, Rejects) {
  for (const char* bad : {"", "-", "--1", "xyz", "0x10", "+10", " 10", "10 ", "1_0", "g", "-ff-"})
    EXPECT_FALSE(parse_chunk_hash_hex(bad).ok()) << bad;
  const auto too_big = parse_chunk_hash_hex("10000000000000000");  // 2^64
  ASSERT_FALSE(too_big.ok());
  EXPECT_TRUE(contains(too_big.error().message, "out of range")) << too_big.error().message;
  EXPECT_FALSE(parse_chunk_hash_hex("-8000000000000001").ok());  // -2^63 - 1
  EXPECT_FALSE(parse_chunk_hash_hex("-ffffffffffffffff").ok());
  EXPECT_FALSE(parse_chunk_hash_hex("fffffffffffffffffffffffffff").ok());
  // A non-hex digit after an overflow still reads as "not hexadecimal".
  EXPECT_TRUE(
      contains(parse_chunk_hash_hex("fffffffffffffffffz").error().message, "not hexadecimal"));
}

TEST(CacheEngineKey, ExampleString) {
  EXPECT_EQ(example().to_string(), "Qwen/Qwen3-8B@2@1@-6ac50906de809457@bfloat16");
  const auto parsed = parse_cache_engine_key("Qwen/Qwen3-8B@2@1@-6ac50906de809457@bfloat16");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(*parsed, example());
  EXPECT_EQ(parsed->chunk_hash, WideInt(-7693565463539782743));
  EXPECT_FALSE(parsed->layer_id.has_value());
  EXPECT_TRUE(parsed->tags.empty());
}

TEST(CacheEngineKey, RoundTrips) {
  std::vector<CacheEngineKey> keys;
  keys.push_back(example());
  auto k = example();
  k.chunk_hash = WideInt::from_unsigned(kUint64Max);
  k.dtype = "fp8_e5m2fnuz";
  keys.push_back(k);
  k.chunk_hash = kInt64Min;
  k.tags = {{"user", "alice"}, {"tier", "gold%50"}, {"", ""}};
  keys.push_back(k);
  k.layer_id = 31;
  keys.push_back(k);
  k.tags.clear();
  k.layer_id = 0;
  k.world_size = 8;
  k.worker_id = 7;
  keys.push_back(k);
  for (const auto& dtype : known_dtypes()) {
    auto d = example();
    d.dtype = std::string(dtype);
    keys.push_back(d);
  }
  for (const auto& key : keys) {
    ASSERT_TRUE(key.validate().ok()) << key.validate().error().message;
    const auto back = parse_cache_engine_key(key.to_string());
    ASSERT_TRUE(back.ok()) << key.to_string() << ": " << back.error().message;
    EXPECT_EQ(*back, key);
    EXPECT_EQ(back->to_string(), key.to_string());
  }
}

TEST(CacheEngineKey, TagsAndLayer) {
  const auto t = parse_cache_engine_key("m@1@0@ff@half@user%bob@x%a%b");
  ASSERT_TRUE(t.ok()) << t.error().message;
  ASSERT_EQ(t->tags.size(), 2u);
  EXPECT_EQ(t->tags[0], (std::pair<std::string, std::string>{"user", "bob"}));
  EXPECT_EQ(t->tags[1], (std::pair<std::string, std::string>{"x", "a%b"}));  // first '%' splits
  EXPECT_FALSE(t->layer_id.has_value());

  const auto l = parse_cache_engine_key("m@1@0@ff@half@12");
  ASSERT_TRUE(l.ok()) << l.error().message;
  EXPECT_EQ(l->layer_id, std::optional<std::int64_t>(12));
  EXPECT_TRUE(l->tags.empty());

  const auto lt = parse_cache_engine_key("m@1@0@ff@half@3@k%v");
  ASSERT_TRUE(lt.ok()) << lt.error().message;
  EXPECT_EQ(lt->layer_id, std::optional<std::int64_t>(3));
  ASSERT_EQ(lt->tags.size(), 1u);
}

TEST(CacheEngineKey, PartCountErrors) {
  EXPECT_TRUE(contains(parse_error(""), "empty"));
  for (const char* few : {"m", "m@1", "m@1@0", "m@1@0@ff", "@@@"}) {
    const auto e = parse_error(few);
    EXPECT_TRUE(contains(e, "expected at least 5")) << e;
  }
}

TEST(CacheEngineKey, PartErrorsNameThePart) {
  struct Case {
    const char* text;
    const char* expected;
  };
  const Case cases[] = {
      {"@1@0@ff@half", "part 1 (model name): is empty"},
      {"m@x@0@ff@half", "part 2 (world size): 'x' is not a decimal integer"},
      {"m@@0@ff@half", "part 2 (world size)"},
      {"m@+1@0@ff@half", "part 2 (world size)"},
      {"m@ 1@0@ff@half", "part 2 (world size)"},
      {"m@1.0@0@ff@half", "part 2 (world size)"},
      {"m@99999999999999999999@0@ff@half", "'99999999999999999999' is out of int64 range"},
      {"m@1@y@ff@half", "part 3 (worker id): 'y' is not a decimal integer"},
      {"m@1@0@xyz@half", "CacheEngineKey part 4 (chunk hash): 'xyz' is not hexadecimal"},
      {"m@1@0@@half", "part 4 (chunk hash): '' is not hexadecimal"},
      {"m@1@0@0x1f@half", "part 4 (chunk hash)"},
      {"m@1@0@10000000000000000@half", "part 4 (chunk hash): '10000000000000000' is out of range"},
      {"m@1@0@-8000000000000001@half", "part 4 (chunk hash)"},
      {"m@1@0@ff@float16", "part 5 (dtype): 'float16' is not a known dtype"},
      {"m@1@0@ff@", "part 5 (dtype)"},
      {"m@1@0@ff@BFLOAT16", "part 5 (dtype)"},
      {"m@1@0@ff@half@oops", "part 6 (layer id or tag): 'oops' is neither"},
      {"m@1@0@ff@half@", "part 6 (layer id or tag)"},
      {"m@1@0@ff@half@k%v@nope", "part 7 (tag): 'nope' is not key%value"},
      {"m@1@0@ff@half@3@4", "part 7 (tag): '4' is not key%value"},
      {"m@1@0@ff@half@k%v@", "part 7 (tag)"},
      {"vllm@m@1@0@ff@half", "legacy"},
  };
  for (const auto& c : cases) {
    const auto e = parse_error(c.text);
    EXPECT_TRUE(contains(e, c.expected)) << c.text << " -> " << e;
  }
}

TEST(CacheEngineKey, HostileInputIsBoundedInMessages) {
  std::string junk(1 << 20, 'z');
  const auto e = parse_error("m@1@0@" + junk + "@half");
  EXPECT_LT(e.size(), 300u) << "error messages quote a bounded excerpt";
  EXPECT_TRUE(contains(e, "truncated"));
  const auto ctl = parse_error(std::string("m@1@0@\x01\xff\n@half", 14));
  EXPECT_TRUE(contains(ctl, "\\x01\\xff\\x0a")) << ctl;
  EXPECT_TRUE(contains(parse_error(std::string(100000, '@')), "part 1"));
  EXPECT_TRUE(contains(parse_error(std::string("m\0@1@0@ff@half\0", 15)), "part 5"));
}

TEST(CacheEngineKey, ManyTagsParse) {
  std::string text = "m@1@0@ff@half";
  for (int i = 0; i < 10000; ++i) text += "@k" + std::to_string(i) + "%v";
  const auto r = parse_cache_engine_key(text);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->tags.size(), 10000u);
  EXPECT_EQ(r->to_string(), text);
}

TEST(CacheEngineKey, ValidateRejectsUnformattableKeys) {
  auto k = example();
  k.model_name = "";
  EXPECT_FALSE(k.validate().ok());
  k.model_name = "a@b";
  EXPECT_FALSE(k.validate().ok());
  k = example();
  k.dtype = "float16";
  EXPECT_FALSE(k.validate().ok());
  k = example();
  k.tags = {{"a%b", "v"}};
  EXPECT_FALSE(k.validate().ok());
  k.tags = {{"a@b", "v"}};
  EXPECT_FALSE(k.validate().ok());
  k.tags = {{"k", "v@w"}};
  EXPECT_FALSE(k.validate().ok());
  k.tags = {{"k", "v%w"}};
  EXPECT_TRUE(k.validate().ok());
}

TEST(KnownDtypes, AllFourteen) {
  EXPECT_EQ(known_dtypes().size(), 14u);
  for (const char* d : {"half", "bfloat16", "float", "double", "int8", "uint8", "int16", "int32",
                        "int64", "bool", "fp8_e4m3fn", "fp8_e4m3fnuz", "fp8_e5m2", "fp8_e5m2fnuz"})
    EXPECT_TRUE(is_known_dtype(d)) << d;
  EXPECT_FALSE(is_known_dtype(""));
  EXPECT_FALSE(is_known_dtype("float32"));
}

}  // namespace
}  // namespace kvnode::keys
