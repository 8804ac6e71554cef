// Chunk-hash chain vs CPython: the building blocks and table of protocol reference §5.5, and
// every case of ../shared/conformance/chunk_hash_vectors.json (produced by CPython 3.12).
#include "kvnode/keys/chunk_hash.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <ostream>
#include <vector>

namespace kvnode::wire {
inline void PrintTo(const WideInt& v, std::ostream* os) {
  *os << v.to_string();
}
}  // namespace kvnode::wire

namespace kvnode::keys {
namespace {

using wire::WideInt;
constexpr std::int64_t kM = (std::int64_t{1} << 61) - 1;
constexpr std::int64_t kInt64Min = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::uint64_t kUint64Max = std::numeric_limits<std::uint64_t>::max();

std::vector<std::int64_t> iota_tokens(std::int64_t first, std::int64_t last_inclusive) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(last_inclusive - first + 1));
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<WideInt> wide(std::initializer_list<std::int64_t> values) {
  return {values.begin(), values.end()};
}

std::vector<WideInt> hash_or_die(std::span<const std::int64_t> tokens, const ChunkHashConfig& cfg) {
  auto r = chunk_hashes(tokens, cfg);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? std::move(r).value() : std::vector<WideInt>{};
}

// The chain of LMCache releases before 0.5.6: (prefix, tokens, None).
ChunkHashConfig legacy() {
  ChunkHashConfig cfg;
  cfg.generation = HashGeneration::kLegacy;
  return cfg;
}

ChunkHashConfig debian311() {
  ChunkHashConfig cfg = legacy();
  cfg.none_hash = kNoneHashDebianPython3112;
  return cfg;
}

TEST(PythonHashInt, IdentityBelowModulus) {
  EXPECT_EQ(python_hash_int(0), 0);
  EXPECT_EQ(python_hash_int(1), 1);
  EXPECT_EQ(python_hash_int(151643), 151643);
  EXPECT_EQ(python_hash_int(kM - 1), kM - 1);
  EXPECT_EQ(python_hash_int(-5), -5);
  EXPECT_EQ(python_hash_int(-(kM - 1)), -(kM - 1));
}

TEST(PythonHashInt, ReferenceValues) {
  EXPECT_EQ(python_hash_int(-1), -2);
  EXPECT_EQ(python_hash_int(-2), -2);
  EXPECT_EQ(python_hash_int(kM), 0);
  EXPECT_EQ(python_hash_int(-kM), 0);
  EXPECT_EQ(python_hash_int(kM + 1), 1);
  EXPECT_EQ(python_hash_int(-(kM + 1)), -2);  // -1 becomes -2 after the reduction too
  EXPECT_EQ(python_hash_int(kInt64Max), 3);
  EXPECT_EQ(python_hash_int(kInt64Min), -4);
  EXPECT_EQ(python_hash_int(WideInt::from_unsigned(kUint64Max)), 7);
  EXPECT_EQ(python_hash_int(WideInt::from_unsigned(std::uint64_t{1} << 63)), 4);
  EXPECT_EQ(python_hash_int(WideInt::from_unsigned(std::uint64_t{1} << 61)), 1);
}

TEST(PythonHashTuple, ReferenceValues) {
  EXPECT_EQ(python_hash_tuple({}), 5740354900026072187);
  const std::int64_t zero[] = {0};
  EXPECT_EQ(python_hash_tuple(zero), -8753497827991233192);
  const std::int64_t one_two_three[] = {1, 2, 3};
  EXPECT_EQ(python_hash_tuple(one_two_three), 529344067295497451);
}

TEST(PythonHashTuple, AllOnesBecomesCPythonConstant) {
  // hash((17, -1555522700513432331)) == 1546275796 in CPython: the accumulator hits 2^64-1.
  const std::int64_t elements[] = {17, -1555522700513432331};
  EXPECT_EQ(python_hash_tuple(elements), 1546275796);
}

TEST(PythonHashTuple, StreamingMatchesSpan) {
  const auto tokens = iota_tokens(-300, 300);
  TupleHasher h;
  for (const std::int64_t t : tokens) h.add(t);
  EXPECT_EQ(h.finish(), python_hash_tuple(tokens));
}

// LMCache 0.5.6's chain, the default: (prefix, tokens, ()), values from CPython 3.11.
TEST(ChunkHashes, ReferenceTableLmcache056) {
  EXPECT_EQ(python_hash_tuple({}), kEmptyTupleHash);
  const auto t600 = iota_tokens(0, 599);
  EXPECT_EQ(hash_or_die(t600, {}),
            wide({3131758554629441992, 8783757053568497755, 4356085038892181893}));
  const std::int64_t t123[] = {1, 2, 3};
  EXPECT_EQ(hash_or_die(t123, {}), wide({7754693342585032853}));
  const auto t1124 = iota_tokens(1000, 2123);
  EXPECT_EQ(hash_or_die(t1124, {}),
            wide({-9006915360733114755, 6249281391258955993, -2988454140027074458,
                  3938654595164371996, -7343215894093276482}));
  ChunkHashConfig minus_one;
  minus_one.init_hash = -1;
  EXPECT_EQ(hash_or_die(t123, minus_one), wide({592499971835444413}));
  ChunkHashConfig full_only;
  full_only.save_unfull_chunk = false;
  EXPECT_EQ(hash_or_die(t600, full_only), wide({3131758554629441992, 8783757053568497755}));
  ChunkHashConfig wide_init;
  wide_init.init_hash = WideInt::from_unsigned(kUint64Max);
  EXPECT_EQ(hash_or_die(t600, wide_init),
            wide({-6633760221003471069, -7769800864305313117, 5409724361975557894}));
  // none_hash is the legacy chain's alone.
  ChunkHashConfig other_none;
  other_none.none_hash = 12345;
  EXPECT_EQ(hash_or_die(t123, other_none), wide({7754693342585032853}));
}

TEST(HashGeneration, NamesRoundTripAndOthersAreRefused) {
  for (const HashGeneration g : {HashGeneration::kLmcache056, HashGeneration::kLegacy}) {
    auto parsed = parse_hash_generation(hash_generation_name(g));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, g);
  }
  EXPECT_EQ(hash_generation_name(HashGeneration::kLmcache056), "lmcache-0.5.6");
  auto bad = parse_hash_generation("0.5.6");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalid);
  EXPECT_NE(bad.error().message.find("lmcache-0.5.6"), std::string::npos) << bad.error().message;
}

TEST(ParseWideInt, WholeRangeAndClearRefusals) {
  EXPECT_EQ(*parse_wide_int("0"), WideInt(0));
  EXPECT_EQ(*parse_wide_int("-9223372036854775808"), WideInt(kInt64Min));
  EXPECT_EQ(*parse_wide_int("18446744073709551615"), WideInt::from_unsigned(kUint64Max));
  for (const char* bad :
       {"", "-", "1.5", "0x10", "18446744073709551616", "-9223372036854775809", " 1"}) {
    auto r = parse_wide_int(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
}

TEST(ChunkHashes, ReferenceTablePython312) {
  const auto t600 = iota_tokens(0, 599);
  EXPECT_EQ(hash_or_die(t600, legacy()),
            wide({-7693565463539782743, 2055708856580048389, -1455558097904284410}));
  const std::int64_t t123[] = {1, 2, 3};
  EXPECT_EQ(hash_or_die(t123, legacy()), wide({8373755996035033071}));
  const auto t1124 = iota_tokens(1000, 2123);
  EXPECT_EQ(hash_or_die(t1124, legacy()),
            wide({-1385495305192787874, -3440327253504673428, 8117490385210471792,
                  -3398586315300791726, -1318209813381188320}));
  ChunkHashConfig minus_one = legacy();
  minus_one.init_hash = -1;
  EXPECT_EQ(hash_or_die(t123, minus_one), wide({-3186794757698923497}));
}

TEST(ChunkHashes, ReferenceTableDebianPython311) {
  const auto t600 = iota_tokens(0, 599);
  EXPECT_EQ(hash_or_die(t600, debian311()),
            wide({-47892457149649943, 3721702759681136408, -6669909349677489762}));
  const std::int64_t t123[] = {1, 2, 3};
  EXPECT_EQ(hash_or_die(t123, debian311()), wide({-6825672454268753873}));
  const auto t1124 = iota_tokens(1000, 2123);
  EXPECT_EQ(hash_or_die(t1124, debian311()),
            wide({6260177701197344926, -2999317074283108446, -4915456347944119758,
                  -3783270255766839896, -5378913357781331183}));
}

TEST(ChunkHashes, TokensAndInitOutsideTheIdentityRange) {
  // Computed by CPython 3.11 in one process whose hash(None) was 8788019534782 (legacy chain).
  ChunkHashConfig cfg = legacy();
  cfg.chunk_size = 3;
  cfg.none_hash = 8788019534782;
  const std::int64_t tokens[] = {-1, -2, kInt64Max, kInt64Min, kM, kM + 5, 7};
  EXPECT_EQ(hash_or_die(tokens, cfg),
            wide({-7620026047149955309, 3054656073185628854, -5139992693231205179}));
  cfg.init_hash = kInt64Min;
  EXPECT_EQ(hash_or_die(tokens, cfg),
            wide({930828959189736622, -406112223503518485, 5752726058800932145}));
  // LMCache 0.5.6's chain (CPython 3.11, any process: hash(()) is a constant).
  ChunkHashConfig current;
  current.chunk_size = 3;
  EXPECT_EQ(hash_or_die(tokens, current),
            wide({-6188743781959087178, 8385845831416103440, -7052347682173103881}));
  current.init_hash = kInt64Min;
  EXPECT_EQ(hash_or_die(tokens, current),
            wide({2362111224380604753, 4481291054898770604, -6021518446168597309}));
}

TEST(ChunkHashes, InitHashIsReducedThroughHashInt) {
  const auto tokens = iota_tokens(5, 700);
  ChunkHashConfig a;
  a.init_hash = WideInt::from_unsigned(kUint64Max);  // hash(2^64-1) == 7
  ChunkHashConfig b;
  b.init_hash = 7;
  EXPECT_EQ(hash_or_die(tokens, a), hash_or_die(tokens, b));
  a.init_hash = kM;  // hash(2^61-1) == 0
  EXPECT_EQ(hash_or_die(tokens, a), hash_or_die(tokens, {}));
}

TEST(ChunkHashes, ChunkingRules) {
  const auto tokens = iota_tokens(0, 599);
  std::span<const std::int64_t> all(tokens);
  EXPECT_TRUE(hash_or_die({}, {}).empty());
  ChunkHashConfig full_only;
  full_only.save_unfull_chunk = false;
  EXPECT_TRUE(hash_or_die(all.first(255), full_only).empty());
  EXPECT_EQ(hash_or_die(all.first(256), full_only).size(), 1u);
  EXPECT_EQ(hash_or_die(all, full_only).size(), 2u);
  EXPECT_EQ(hash_or_die(all.first(512), {}).size(), 2u);  // no empty trailing chunk
  // Each key depends only on its prefix: full chunks agree whatever follows.
  const auto whole = hash_or_die(all, {});
  const auto prefix = hash_or_die(all.first(512), {});
  EXPECT_EQ(std::vector<WideInt>(whole.begin(), whole.begin() + 2), prefix);
  EXPECT_EQ(hash_or_die(all, full_only), prefix);
  ChunkHashConfig one;
  one.chunk_size = 1;
  EXPECT_EQ(hash_or_die(all, one).size(), 600u);
  ChunkHashConfig huge;
  huge.chunk_size = std::numeric_limits<std::size_t>::max();
  EXPECT_EQ(hash_or_die(all, huge).size(), 1u);
  huge.save_unfull_chunk = false;
  EXPECT_TRUE(hash_or_die(all, huge).empty());
}

TEST(ChunkHashes, ZeroChunkSizeIsAnError) {
  ChunkHashConfig cfg;
  cfg.chunk_size = 0;
  EXPECT_FALSE(validate(cfg).ok());
  const std::int64_t tokens[] = {1, 2, 3};
  const auto r = chunk_hashes(tokens, cfg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("chunk_size"), std::string::npos);
  EXPECT_FALSE(chunk_hashes({}, cfg).ok());
}

TEST(ChunkGeometry, NumChunksAndEndToken) {
  EXPECT_EQ(num_chunks(0, 256, true), 0u);
  EXPECT_EQ(num_chunks(600, 256, true), 3u);
  EXPECT_EQ(num_chunks(600, 256, false), 2u);
  EXPECT_EQ(num_chunks(512, 256, true), 2u);
  EXPECT_EQ(num_chunks(5, 0, true), 0u);
  EXPECT_EQ(chunk_end_token(0, 600, 256), 256u);
  EXPECT_EQ(chunk_end_token(1, 600, 256), 512u);
  EXPECT_EQ(chunk_end_token(2, 600, 256), 600u);
  EXPECT_EQ(chunk_end_token(7, 600, 256), 600u);
  constexpr auto kMax = std::numeric_limits<std::size_t>::max();
  EXPECT_EQ(chunk_end_token(kMax, 600, 256), 600u);      // (i+1) would wrap
  EXPECT_EQ(chunk_end_token(kMax / 2, 600, 256), 600u);  // (i+1)*c would wrap
  EXPECT_EQ(chunk_end_token(0, 600, kMax), 600u);
  EXPECT_EQ(chunk_end_token(3, 600, 0), 0u);
}

// ---- conformance file ---------------------------------------------------------------------

std::optional<WideInt> json_wide(const nlohmann::json& j) {
  if (j.type() == nlohmann::json::value_t::number_unsigned)
    return WideInt::from_unsigned(j.get<std::uint64_t>());
  if (j.type() == nlohmann::json::value_t::number_integer)
    return WideInt::from_signed(j.get<std::int64_t>());
  return std::nullopt;
}

// The vectors were taken from LMCache releases before 0.5.6: the legacy chain.
TEST(ChunkHashVectors, AllCasesMatchCPython312) {
  const std::filesystem::path path =
      std::filesystem::path(KVNODE_SHARED_DIR) / "conformance" / "chunk_hash_vectors.json";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "conformance vectors not found at " << path
                 << " (configure with -DKVNODE_SHARED_DIR=<folder holding conformance/>)";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path;
  const auto doc = nlohmann::json::parse(in);
  const auto& cases = doc.at("cases");
  ASSERT_FALSE(cases.empty());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const auto& c = cases[i];
    std::vector<std::int64_t> tokens;
    for (const auto& t : c.at("tokens")) {
      const auto w = json_wide(t);
      ASSERT_TRUE(w && w->as_int64()) << "token " << t.dump() << " is not an int64";
      tokens.push_back(*w->as_int64());
    }
    ChunkHashConfig cfg = legacy();
    cfg.chunk_size = c.at("chunk_size").get<std::size_t>();
    cfg.save_unfull_chunk = c.at("save_unfull_chunk").get<bool>();
    const auto init = json_wide(c.at("init_hash"));
    ASSERT_TRUE(init) << "init_hash " << c.at("init_hash").dump();
    cfg.init_hash = *init;
    std::vector<WideInt> expected;
    for (const auto& h : c.at("hashes")) {
      const auto w = json_wide(h);
      ASSERT_TRUE(w) << "hash " << h.dump();
      expected.push_back(*w);
    }
    EXPECT_EQ(hash_or_die(tokens, cfg), expected)
        << tokens.size() << " tokens, chunk_size " << cfg.chunk_size << ", save_unfull_chunk "
        << cfg.save_unfull_chunk << ", init_hash " << cfg.init_hash.to_string();
  }
}

}  // namespace
}  // namespace kvnode::keys
