// Property tests: random messages of every type survive msgpack and JSON round trips, and random
// mutations of valid encodings never crash the decoder (ASan/UBSan watch every run).
#include <gtest/gtest.h>

#include "kvnode/wire/codec.hpp"
#include "kvnode/wire/json.hpp"
#include "support/random_messages.hpp"

namespace kvnode::wire {
namespace {

constexpr int kPerType = 150;

TEST(Property, EveryTypeRoundTripsThroughMsgpack) {
  test::RandomMessages gen(20261202);
  for (std::size_t type = 0; type < std::variant_size_v<Msg>; ++type) {
    for (int i = 0; i < kPerType; ++i) {
      const Msg msg = gen.message(type);
      const std::string bytes = encode(msg);
      auto back = decode(bytes);
      ASSERT_TRUE(back.ok()) << tag_of(msg) << ": " << back.error().message;
      ASSERT_TRUE(*back == msg) << tag_of(msg)
                                << " changed in a round trip: " << to_builtins(msg).dump();
      EXPECT_EQ(encode(*back), bytes) << tag_of(msg);
    }
  }
}

TEST(Property, EveryTypeRoundTripsThroughJson) {
  test::RandomMessages gen(7);
  for (std::size_t type = 0; type < std::variant_size_v<Msg>; ++type) {
    for (int i = 0; i < kPerType; ++i) {
      const Msg msg = gen.message(type);
      const std::string json = to_builtins(msg).dump();
      auto back = decode(json);
      ASSERT_TRUE(back.ok()) << json << ": " << back.error().message;
      ASSERT_EQ(encode(*back), encode(msg)) << json;
    }
  }
}

TEST(Property, NestedRootsRoundTrip) {
  test::RandomMessages gen(11);
  for (int i = 0; i < 500; ++i) {
    KVOpEvent ev;
    gen.fill(ev);
    std::string bytes;
    encode(ev, bytes);
    auto back = decode_kv_op_event(bytes);
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_TRUE(*back == ev);

    AnyCommand cmd;
    gen.fill(cmd);
    bytes.clear();
    encode(cmd, bytes);
    auto cmd_back = decode_command(bytes);
    ASSERT_TRUE(cmd_back.ok()) << cmd_back.error().message;
    EXPECT_TRUE(*cmd_back == cmd);
  }
}

// Mutations: flip, insert, delete, truncate, splice. Whatever decodes must re-encode to bytes that
// decode to the same message; whatever fails must say why.
TEST(Property, MutatedEncodingsNeverCrash) {
  test::RandomMessages gen(99);
  std::mt19937_64 rng(5);
  auto below = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  int decoded = 0, rejected = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = encode(gen.message(below(std::variant_size_v<Msg>)));
    for (std::size_t m = 0, n = 1 + below(3); m < n; ++m) {
      const std::size_t at = below(bytes.size());
      switch (below(5)) {
        case 0:
          bytes[at] = static_cast<char>(rng());
          break;
        case 1:
          bytes.insert(at, 1, static_cast<char>(rng()));
          break;
        case 2:
          bytes.erase(at, 1 + below(4));
          break;
        case 3:
          bytes.resize(at);
          break;
        default:
          bytes.insert(at, bytes.substr(below(bytes.size()), below(16)));
          break;
      }
    }
    auto r = decode(bytes);
    if (!r) {
      ++rejected;
      ASSERT_FALSE(r.error().message.empty());
      continue;
    }
    ++decoded;
    auto again = decode(encode(*r));
    ASSERT_TRUE(again.ok()) << again.error().message;
    ASSERT_TRUE(*again == *r);
  }
  EXPECT_GT(decoded, 100);    // mutations inside string bodies or values still decode
  EXPECT_GT(rejected, 1000);  // and most structural damage is caught
}

}  // namespace
}  // namespace kvnode::wire
