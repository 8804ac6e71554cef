// Ground truth from the real msgspec (../shared/conformance): every vector must encode to the
// exact bytes and decode to the exact value; every decode case must be accepted or rejected with
// msgspec's own error text.
#include <gtest/gtest.h>

#include "kvnode/wire/codec.hpp"
#include "kvnode/wire/json.hpp"
#include "support/shared_files.hpp"

namespace kvnode::wire {
namespace {

using test::from_hex;
using test::to_hex;

Root root_of(const std::string& decode_as) {
  if (decode_as == "KVOpEvent") return Root::kKVOpEvent;
  if (decode_as == "AnyCommand") return Root::kAnyCommand;
  return Root::kMsg;
}

// Decodes `payload` as the vector's decode_as root type and returns its builtins as plain JSON.
Result<nlohmann::json> decode_as(const std::string& decode_as, std::string_view payload) {
  auto r = decode_to_builtins(payload, root_of(decode_as));
  if (!r) return r.error();
  return nlohmann::json::parse(r->dump());
}

Result<std::string> encode_as(const std::string& decode_as, std::string_view json) {
  return reencode(json, root_of(decode_as));
}

TEST(Conformance, EveryVectorEncodesByteExact) {
  KVNODE_LOAD_CONFORMANCE_OR_SKIP(vectors, "lmcache_vectors.json");
  ASSERT_GE(vectors.size(), 150u);
  for (const auto& v : vectors) {
    const std::string name = v["type"].get<std::string>() + "/" + v["variant"].get<std::string>();
    auto bytes = encode_as(v["decode_as"], v["value"].dump());
    ASSERT_TRUE(bytes.ok()) << name << ": " << bytes.error().message;
    EXPECT_EQ(to_hex(*bytes), v["msgpack_hex"].get<std::string>()) << name;
  }
}

TEST(Conformance, EveryVectorDecodesToItsValue) {
  KVNODE_LOAD_CONFORMANCE_OR_SKIP(vectors, "lmcache_vectors.json");
  for (const auto& v : vectors) {
    const std::string name = v["type"].get<std::string>() + "/" + v["variant"].get<std::string>();
    auto value = decode_as(v["decode_as"], from_hex(v["msgpack_hex"].get<std::string>()));
    ASSERT_TRUE(value.ok()) << name << ": " << value.error().message;
    EXPECT_EQ(*value, nlohmann::json(v["value"])) << name;
  }
}

TEST(Conformance, EveryVectorsJsonFormDecodesToTheSameValue) {
  KVNODE_LOAD_CONFORMANCE_OR_SKIP(vectors, "lmcache_vectors.json");
  for (const auto& v : vectors) {
    const std::string name = v["type"].get<std::string>() + "/" + v["variant"].get<std::string>();
    auto value = decode_as(v["decode_as"], v["json"].get<std::string>());
    ASSERT_TRUE(value.ok()) << name << ": " << value.error().message;
    EXPECT_EQ(*value, nlohmann::json(v["value"])) << name;
  }
}

TEST(Conformance, AllFiftyOneMessageTypesAreCovered) {
  KVNODE_LOAD_CONFORMANCE_OR_SKIP(vectors, "lmcache_vectors.json");
  std::set<std::string> tags;
  for (const auto& v : vectors)
    if (v["decode_as"] == "Msg") tags.insert(v["type"].get<std::string>());
  EXPECT_EQ(tags.size(), std::variant_size_v<Msg>);
}

TEST(Conformance, DecodeCasesAcceptAndRejectExactlyAsMsgspec) {
  KVNODE_LOAD_CONFORMANCE_OR_SKIP(cases, "decode_cases.json");
  ASSERT_GE(cases.size(), 40u);
  for (const auto& c : cases) {
    const std::string name = c["name"];
    auto value = decode_as("Msg", from_hex(c["input_hex"].get<std::string>()));
    if (c["ok"].get<bool>()) {
      ASSERT_TRUE(value.ok()) << name << ": " << value.error().message;
      EXPECT_EQ(*value, nlohmann::json(c["value"])) << name;
    } else {
      ASSERT_FALSE(value.ok()) << name << " was accepted: " << value->dump();
      EXPECT_EQ(value.error().message, c["error"].get<std::string>()) << name;
    }
  }
}

}  // namespace
}  // namespace kvnode::wire
