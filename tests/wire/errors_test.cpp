// Rejections beyond the conformance files: each names the problem and the path, as msgspec does.
#include <gtest/gtest.h>

#include <chrono>

#include "kvnode/wire/codec.hpp"
#include "kvnode/wire/json.hpp"
#include "support/shared_files.hpp"

namespace kvnode::wire {
namespace {

std::string error_of(std::string_view payload) {
  auto r = decode(payload);
  return r.ok() ? "accepted: " + to_builtins(*r).dump() : r.error().message;
}

// Builds msgpack from JSON so the cases stay readable; fields not given keep valid values.
std::string msgpack_of(std::string_view json) {
  auto r = json_to_msgpack(json);
  EXPECT_TRUE(r.ok()) << json;
  return r.ok() ? *r : std::string();
}

TEST(JsonErrors, UseJsonNamesAndMsgspecTexts) {
  EXPECT_EQ(
      error_of(R"({"type":"KVAdmitMsg","instance_id":"i","worker_id":1,"key":5,"location":null})"),
      "Expected `str`, got `null` - at `$.location`");
  EXPECT_EQ(error_of(R"({"type":"Nope"})"), "Invalid value 'Nope' - at `$.type`");
  EXPECT_EQ(error_of(R"({"type":"ErrorMsg",)"), "Input data was truncated");
  EXPECT_EQ(error_of(R"({x})"), "JSON is malformed: invalid character (byte 1)");
  EXPECT_EQ(error_of(R"({"type":"ErrorMsg","error":"e"} x)"),
            "JSON is malformed: trailing characters (byte 32)");
  EXPECT_EQ(
      error_of(R"({"type":"KVAdmitMsg","instance_id":"i","worker_id":1.5,"key":5,"location":"L"})"),
      "Expected `int`, got `float` - at `$.worker_id`");
}

TEST(JsonErrors, IntKeyedMapsTakeNumericStringKeysOnly) {
  auto ok = decode(R"({"type":"HealthRetMsg","event_id":"e","error_codes":{"0":0,"-3":-1}})");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  const auto& codes = std::get<HealthRetMsg>(*ok).error_codes;
  ASSERT_EQ(codes.size(), 2u);
  EXPECT_EQ(*codes.find(-3), -1);
  EXPECT_EQ(error_of(R"({"type":"HealthRetMsg","event_id":"e","error_codes":{"zero":0}})"),
            "Expected `int`, got `str` - at `key` in `$.error_codes`");
}

TEST(JsonErrors, DeepNestingIsBounded) {
  std::string deep = R"({"type":"ErrorMsg","error":"e","junk":)" + std::string(5000, '[') +
                     std::string(5000, ']') + "}";
  EXPECT_EQ(error_of(deep), "maximum recursion depth exceeded while deserializing an object");
  std::string fine = R"({"type":"ErrorMsg","error":"e","junk":)" + std::string(100, '[') +
                     std::string(100, ']') + "}";
  EXPECT_TRUE(decode(fine).ok());
}

TEST(MsgpackErrors, InvalidUtf8GetsCPythonsText) {
  // ErrorMsg{error: "a\xff"}
  const std::string bad = test::from_hex("82a474797065a84572726f724d7367a56572726f72a261ff");
  EXPECT_EQ(error_of(bad),
            "'utf-8' codec can't decode byte 0xff in position 1: invalid start byte");
  const std::string cut = test::from_hex("82a474797065a84572726f724d7367a56572726f72a261e2");
  EXPECT_EQ(error_of(cut),
            "'utf-8' codec can't decode byte 0xe2 in position 1: unexpected end of data");
  const std::string surrogate =
      test::from_hex("82a474797065a84572726f724d7367a56572726f72a3eda080");
  EXPECT_EQ(error_of(surrogate),
            "'utf-8' codec can't decode byte 0xed in position 0: invalid continuation byte");
}

TEST(MsgpackErrors, OptionalFieldsNameTheNullableType) {
  EXPECT_EQ(
      error_of(msgpack_of(
          R"({"type":"RegisterMsg","instance_id":"i","worker_id":0,"ip":"h","port":1,"peer_init_url":7})")),
      "Expected `str | null`, got `int` - at `$.peer_init_url`");
  EXPECT_EQ(
      error_of(msgpack_of(R"({"type":"MoveWorkerMsg","worker_event_id":"w","old_position":"L",)"
                          R"("new_position":["p","L"],"copy":"yes"})")),
      "Expected `bool | null`, got `str` - at `$.copy`");
}

TEST(MsgpackErrors, NestedPathsThroughTuplesDictsAndLists) {
  EXPECT_EQ(error_of(msgpack_of(
                R"({"type":"LookupRetMsg","event_id":"e","layout_info":{"A":["L","x"]}})")),
            "Expected `int`, got `str` - at `$.layout_info[...][1]`");
  EXPECT_EQ(error_of(msgpack_of(
                R"({"type":"QueryWorkerInfoRetMsg","event_id":"e","worker_infos":[)"
                R"({"instance_id":"i","worker_id":0,"ip":"h","port":1,"peer_init_url":null,)"
                R"("registration_time":1.0}]})")),
            "Object missing required field `last_heartbeat_time` - at `$.worker_infos[0]`");
  EXPECT_EQ(
      error_of(msgpack_of(
          R"({"type":"BatchedP2PLookupMsg","hashes":[1,2,"3"],"instance_id":"i","worker_id":0})")),
      "Expected `int`, got `str` - at `$.hashes[2]`");
}

TEST(MsgpackErrors, IntegersOutsideInt64AreRefusedOutsideChunkHashes) {
  // worker_id = 2^64-1: chunk hashes carry it, ordinary int fields are int64.
  EXPECT_EQ(
      error_of(msgpack_of(
          R"({"type":"FullSyncStatusMsg","instance_id":"i","worker_id":18446744073709551615,"sync_id":"s"})")),
      "Expected `int` <= 9223372036854775807 - at `$.worker_id`");
}

TEST(MsgpackErrors, KeysMustBeStringsAndTagsConsistent) {
  // {1: 2, "type": "ErrorMsg", "error": "e"}
  EXPECT_EQ(error_of(test::from_hex("830102a474797065a84572726f724d7367a56572726f72a165")),
            "Expected `str`, got `int` - at `key` in `$`");
  // a second "type" naming another class
  EXPECT_EQ(error_of(test::from_hex(
                "83a474797065a84572726f724d7367a56572726f72a165a474797065aa4b5641646d69744d7367")),
            "Invalid value 'KVAdmitMsg' - at `$.type`");
  // an ext value where an int belongs
  EXPECT_EQ(error_of(test::from_hex(
                "82a474797065b24865616c7468576f726b65725265744d7367aa6572726f725f636f6465d40100")),
            "Expected `int`, got `ext` - at `$.error_code`");
}

TEST(MsgpackErrors, CommandArgsNeedStringKeysAndHashableNestedKeys) {
  const std::string prefix =
      "82a474797065af4865617274626561745265744d7367a8636f6d6d616e64739182ac636f6d6d616e645f74797065"
      "a966756c6c5f73796e63"
      "a46172677381";
  // args: {[1]: 1} -- args is dict[str, Any]
  EXPECT_EQ(error_of(test::from_hex(prefix + "910101")),
            "Expected `str`, got `array` - at `key` in `$.commands[0].args`");
  // args: {"a": {[1]: 1}} -- inside Any, keys must be hashable as in a Python dict
  EXPECT_EQ(error_of(test::from_hex(prefix + "a16181910101")), "unhashable type: 'list'");
}

TEST(Decoding, DuplicateKeysInBigMapsKeepFirstPositionAndLastValue) {
  std::string json = R"({"type":"RegisterRetMsg","extra_config":{)";
  for (int i = 0; i < 40; ++i)
    json += "\"k" + std::to_string(i % 20) + "\":\"v" + std::to_string(i) + "\",";
  json.back() = '}';
  json += "}";
  auto r = decode(msgpack_of(json));
  ASSERT_TRUE(r.ok()) << r.error().message;
  const auto& cfg = std::get<RegisterRetMsg>(*r).extra_config;
  ASSERT_EQ(cfg.size(), 20u);
  EXPECT_EQ(cfg.items[0].first, "k0");
  EXPECT_EQ(cfg.items[0].second, "v20");
  EXPECT_EQ(cfg.items[19].second, "v39");
}

TEST(Decoding, HugeLengthHeadersFailWithoutAllocating) {
  // 32-bit headers claiming 4 G entries or bytes in a few bytes of input: truncated, nothing
  // reserved.
  const char* kHuge[] = {
      "83a474797065b3426174636865645032504c6f6f6b75704d7367a6686173686573ddffffffff",  // hashes:
                                                                                       // array32
      "82a474797065ae52656769737465725265744d7367ac65787472615f636f6e666967dfffffffff",  // extra_config:
                                                                                         // map32
      "82a474797065a84572726f724d7367a56572726f72dbffffffff",  // error: str32
  };
  for (const char* hex : kHuge)
    EXPECT_EQ(error_of(test::from_hex(hex)), "Input data was truncated") << hex;
  // bin32 inside a command's Any args
  auto r = decode_command(
      test::from_hex("83ac636f6d6d616e645f74797065a966756c6c5f73796e63a6726561736f6ec0a4617267738"
                     "1a161c6ffffffff"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "Input data was truncated");
}

TEST(Decoding, NestedHugeHeadersDoNotMultiplyReservations) {
  // args: {"a": [[[... 990 arrays each claiming 2^32-1 elements ...]]]} followed by 4 MiB of zeros.
  // Reserving against the bytes left at every level would ask for hundreds of GB.
  std::string bytes = test::from_hex(
      "82a474797065af4865617274626561745265744d7367a8636f6d6d616e64739182ac636f6d6d616e645f74797065"
      "a966756c6c5f73796e63"
      "a46172677381a161");
  for (int i = 0; i < 990; ++i) bytes += test::from_hex("ddffffffff");
  bytes.append(4 << 20, '\0');
  EXPECT_EQ(error_of(bytes), "Input data was truncated");
}

TEST(Decoding, RepeatedIntKeysKeepFirstPositionAndLastValue) {
  // error_codes with 1000 entries over 7 distinct keys: sorted, not hashed, so chosen keys are
  // cheap.
  std::string json = R"({"type":"HealthRetMsg","event_id":"e","error_codes":{)";
  for (int i = 0; i < 1000; ++i)
    json += "\"" + std::to_string((i % 7) * 172933) + "\":" + std::to_string(i) + ",";
  json.back() = '}';
  json += "}";
  auto r = decode(json);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const auto& codes = std::get<HealthRetMsg>(*r).error_codes;
  ASSERT_EQ(codes.size(), 7u);
  for (int k = 0; k < 7; ++k) {
    EXPECT_EQ(codes.items[static_cast<std::size_t>(k)].first, k * 172933);
    EXPECT_EQ(codes.items[static_cast<std::size_t>(k)].second, 994 + k - (k >= 6 ? 7 : 0));
  }
}

TEST(Decoding, TagMayComeAnywhereAndUnknownKeysAreSkipped) {
  auto r =
      decode(msgpack_of(R"({"extra":{"a":[1,2,{"b":null}]},"error":"boom","type":"ErrorMsg"})"));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(std::get<ErrorMsg>(*r).error, "boom");
}

// KV events take a fast path when they have msgspec's exact shape; every other shape must decode
// (or fail) exactly as the general decoder says, element by element.
TEST(Decoding, KvEventsOfAnyShapeDecodeAlikeAndFailWithTheirPath) {
  BatchedKVOperationMsg batch{"i", 1, "L", {}};
  // Every msgpack int width, both signs, for key and seq_num; 2^64-1 only where ints may be.
  const std::int64_t ints[] = {0,      1,         127,       128,       255,       256,      65535,
                               65536,  -1,        -32,       -33,       -128,      -129,     -32768,
                               -32769, INT32_MIN, INT32_MAX, 1ll << 40, INT64_MIN, INT64_MAX};
  for (const std::int64_t v : ints)
    batch.operations.push_back({v % 2 ? OpType::kAdmit : OpType::kEvict, ChunkHash(v), v});
  batch.operations.push_back({OpType::kAdmit, ChunkHash::from_unsigned(~0ull), 7});
  auto r = decode(encode(Msg{batch}));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(std::get<BatchedKVOperationMsg>(*r), batch);

  // Fields reordered, an extra field, and the fast shape around them: all decoded.
  auto mixed = decode(msgpack_of(
      R"({"type":"BatchedKVOperationMsg","instance_id":"i","worker_id":1,"location":"L","operations":[)"
      R"({"op_type":"admit","key":5,"seq_num":1},{"seq_num":2,"key":-6,"op_type":"evict"},)"
      R"({"op_type":"admit","key":7,"seq_num":3,"extra":[1]},{"op_type":"evict","key":8,"seq_num":4}]})"));
  ASSERT_TRUE(mixed.ok()) << mixed.error().message;
  const auto& ops = std::get<BatchedKVOperationMsg>(*mixed).operations;
  ASSERT_EQ(ops.size(), 4u);
  EXPECT_EQ(ops[1], (KVOpEvent{OpType::kEvict, ChunkHash(-6), 2}));
  EXPECT_EQ(ops[2], (KVOpEvent{OpType::kAdmit, ChunkHash(7), 3}));
  EXPECT_EQ(ops[3], (KVOpEvent{OpType::kEvict, ChunkHash(8), 4}));

  // Bad values after a fast-path prefix are reported by the general decoder with their path.
  const std::string head =
      R"({"type":"BatchedKVOperationMsg","instance_id":"i","worker_id":1,"location":"L","operations":[)"
      R"({"op_type":"admit","key":5,"seq_num":1},)";
  EXPECT_EQ(error_of(msgpack_of(head +
                                R"({"op_type":"admit","key":5,"seq_num":18446744073709551615}]})")),
            "Expected `int` <= 9223372036854775807 - at `$.operations[1].seq_num`");
  EXPECT_EQ(error_of(msgpack_of(head + R"({"op_type":"admit","key":"5","seq_num":1}]})")),
            "Expected `int`, got `str` - at `$.operations[1].key`");
  EXPECT_EQ(error_of(msgpack_of(head + R"({"op_type":"admits","key":5,"seq_num":1}]})")),
            "Invalid enum value 'admits' - at `$.operations[1].op_type`");
  EXPECT_EQ(error_of(msgpack_of(head + R"({"op_type":"admit","key":5}]})")),
            "Object missing required field `seq_num` - at `$.operations[1]`");
  // Cut inside the int that follows a matched prefix.
  std::string cut =
      encode(Msg{BatchedKVOperationMsg{"i", 1, "L", {{OpType::kAdmit, ChunkHash(1ll << 40), 1}}}});
  cut.resize(cut.size() - 12);
  EXPECT_EQ(error_of(cut), "Input data was truncated");
}

// Hash lists read runs of 8-byte ints in bulk; every other int width, a non-int and a cut must
// come out exactly as the general decoder says.
TEST(Decoding, HashListsOfAnyIntWidthDecodeAlikeAndFailWithTheirPath) {
  BatchedP2PLookupMsg lookup{{}, "i", 0};
  const std::int64_t ints[] = {
      INT64_MIN, -1ll << 40, 0,         1,         127,          128,          65536,
      -33,       INT32_MIN,  INT64_MAX, 1ll << 40, -(1ll << 33), INT64_MIN + 1};
  for (const std::int64_t v : ints) lookup.hashes.push_back(ChunkHash(v));
  lookup.hashes.push_back(ChunkHash::from_unsigned(~0ull));  // uint 64 between int 64s
  lookup.hashes.push_back(ChunkHash(-5ll << 50));
  auto r = decode(encode(Msg{lookup}));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(std::get<BatchedP2PLookupMsg>(*r), lookup);

  const std::string head =
      R"({"type":"BatchedP2PLookupMsg","instance_id":"i","worker_id":0,"hashes":[)"
      R"(-4611686018427387904,-4611686018427387905,)";
  EXPECT_EQ(error_of(msgpack_of(head + R"(5,"6"]})")),
            "Expected `int`, got `str` - at `$.hashes[3]`");
  EXPECT_EQ(error_of(msgpack_of(head + R"(-4611686018427387906,null]})")),
            "Expected `int`, got `None` - at `$.hashes[3]`");  // msgspec's word for msgpack nil
  // Cut anywhere inside the second of two 8-byte ints (no other 0xd3 byte in the message).
  const std::string whole =
      encode(Msg{BatchedP2PLookupMsg{{ChunkHash(-1ll << 40), ChunkHash(-1ll << 41)}, "i", 0}});
  for (std::size_t keep = 1; keep < 9; ++keep) {
    std::string bytes = whole;
    const std::size_t at = bytes.rfind('\xd3');
    ASSERT_NE(at, std::string::npos);
    bytes.resize(at + keep);
    EXPECT_EQ(error_of(bytes), "Input data was truncated") << keep;
  }
}

// The bulk path must cost nothing on lists of other ints: a message of 500 k one-byte ints (any
// peer may send one) once cost time quadratic in its length (minutes), now a few milliseconds.
TEST(Decoding, LongListsOfSmallIntsDecodeInLinearTime) {
  for (const bool alternate : {false, true}) {
    BatchedP2PLookupMsg lookup{{}, "i", 0};
    for (int i = 0; i < 500000; ++i)
      lookup.hashes.push_back(alternate && i % 2 ? ChunkHash(-1ll << 40) : ChunkHash(i % 100));
    const std::string bytes = encode(Msg{lookup});
    const auto start = std::chrono::steady_clock::now();
    auto r = decode(bytes);
    const auto spent = std::chrono::steady_clock::now() - start;
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(std::get<BatchedP2PLookupMsg>(*r).hashes, lookup.hashes);
    EXPECT_LT(spent, std::chrono::seconds(5))
        << "alternate " << alternate;  // linear: well under 0.1 s
  }
}

TEST(Encoding, DefaultsAreAlwaysWritten) {
  Msg m = MoveMsg{"e", {"A", "LocalCPUBackend"}, {"B", "LocalCPUBackend"}, std::nullopt, false};
  auto back = to_builtins(m);
  EXPECT_EQ(back.dump(),
            R"({"type":"MoveMsg","event_id":"e","old_position":["A","LocalCPUBackend"],)"
            R"("new_position":["B","LocalCPUBackend"],"tokens":null,"copy":false})");
  EXPECT_EQ(python_class_text("KVAdmitMsg"),
            "<class 'lmcache.v1.cache_controller.message.KVAdmitMsg'>");
}

}  // namespace
}  // namespace kvnode::wire
