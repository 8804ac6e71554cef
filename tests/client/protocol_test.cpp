// The local socket's codec and framing, as the client library builds them: every field of a
// request and a reply survives a round trip, an op is parsed once into LocalOp, an error's code
// travels by name (unknown names are kInternal), and the frame reader refuses an oversized
// length before allocating and grows a frame's buffer only with the bytes that arrive.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>
#include <string>

#include "kvnode/client/local_framing.hpp"
#include "kvnode/client/local_protocol.hpp"

namespace kvnode::client::protocol {
namespace {

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

TEST(LocalProtocol, ARequestRoundTripsWithEveryField) {
  for (const LocalOp op :
       {LocalOp::kInfo, LocalOp::kHashes, LocalOp::kContains, LocalOp::kLookup, LocalOp::kPut,
        LocalOp::kGet, LocalOp::kReserve, LocalOp::kCommit, LocalOp::kAbort, LocalOp::kLease,
        LocalOp::kRelease, LocalOp::kRetrieve}) {
    Request q;
    q.op = op;
    q.hashes = {1, -2, INT64_MAX, INT64_MIN};
    q.data = {std::byte{1}, std::byte{0}, std::byte{255}};
    q.hold = 7;
    q.since = 99;
    Result<Request> back = decode_request(encode(q));
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(back->op, op) << to_string(op);
    EXPECT_EQ(back->hashes, q.hashes);
    EXPECT_FALSE(back->by_tokens);
    EXPECT_EQ(back->data, q.data);
    EXPECT_EQ(back->hold, 7u);
    EXPECT_EQ(back->since, 99u);
  }
  Request t;
  t.op = LocalOp::kLookup;
  t.by_tokens = true;
  t.tokens = {5, 6, 7};
  Result<Request> back = decode_request(encode(t));
  ASSERT_TRUE(back);
  EXPECT_TRUE(back->by_tokens);
  EXPECT_EQ(back->tokens, t.tokens);
}

TEST(LocalProtocol, TokensTravelAsOneBinaryFieldForNodesThatSaySo) {
  Request t;
  t.op = LocalOp::kLookup;
  t.by_tokens = true;
  t.binary_tokens = true;
  t.tokens = {5, -6, INT64_MAX, INT64_MIN, 0};
  const std::vector<std::byte> bytes = encode(t);
  const std::string raw(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  EXPECT_NE(raw.find("token_bytes"), std::string::npos);
  EXPECT_EQ(raw.find("\xa6tokens"), std::string::npos) << "not as msgpack integers too";
  Result<Request> back = decode_request(bytes);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_TRUE(back->by_tokens);
  EXPECT_EQ(back->tokens, t.tokens);

  // A bin that is not whole tokens, and tokens given twice, are refused by name.
  std::string torn = raw;
  const std::size_t at = torn.find("token_bytes") + std::string("token_bytes").size();
  ASSERT_EQ(static_cast<unsigned char>(torn[at]), 0xc4);  // bin 8, then its length: 40
  torn[at + 1] = 39;
  torn.erase(at + 2, 1);
  Result<Request> bad = decode_request(bytes_of(torn));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("request.token_bytes: 39 bytes: not whole int64 tokens"),
            std::string::npos)
      << bad.error().message;
  Request both = t;
  both.binary_tokens = false;
  std::vector<std::byte> twice = encode(both);  // a map of "op" and "tokens" ...
  const std::vector<std::byte> binary = encode(t);
  // ... and the binary map's "token_bytes" entry appended: the map header says 3 entries.
  ASSERT_EQ(static_cast<unsigned char>(twice[0]), 0x82);
  twice[0] = std::byte{0x83};
  const std::string b(reinterpret_cast<const char*>(binary.data()), binary.size());
  const std::size_t entry = b.find("token_bytes") - 1;  // its fixstr header
  for (std::size_t i = entry; i < b.size(); ++i) twice.push_back(static_cast<std::byte>(b[i]));
  bad = decode_request(twice);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("tokens given twice"), std::string::npos)
      << bad.error().message;
}

TEST(LocalProtocol, TheInfoReplySaysTheNodeReadsBinaryTokens) {
  Reply r;
  r.binary_tokens = true;
  Result<Reply> back = decode_reply(encode(r));
  ASSERT_TRUE(back);
  EXPECT_TRUE(back->binary_tokens);
  back = decode_reply(encode(Reply{}));
  ASSERT_TRUE(back);
  EXPECT_FALSE(back->binary_tokens) << "older nodes do not say: integers";
}

TEST(LocalProtocol, AnUnknownOpIsRefusedOnDecodingWithTheKnownOnes) {
  Request q;
  q.op = LocalOp::kInfo;
  std::vector<std::byte> bytes = encode(q);
  // "info" -> "inff": the same length, an op nobody knows.
  const std::string s(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::string bad = s;
  bad.replace(bad.find("info"), 4, "inff");
  Result<Request> r = decode_request(bytes_of(bad));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kInvalid);
  EXPECT_NE(r.error().message.find("unknown operation 'inff' (info, hashes, contains"),
            std::string::npos)
      << r.error().message;
}

// One map per frame: bytes after it (a stray byte, a second map) are refused, not ignored.
TEST(LocalProtocol, BytesAfterTheMessageAreRefused) {
  Request q;
  q.op = LocalOp::kInfo;
  const std::vector<std::byte> one = encode(q);
  ASSERT_TRUE(decode_request(one));
  std::vector<std::byte> stray = one;
  stray.push_back(std::byte{0xc0});  // msgpack nil
  Result<Request> r = decode_request(stray);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kInvalid);
  EXPECT_NE(r.error().message.find("1 bytes after the message"), std::string::npos)
      << r.error().message;
  std::vector<std::byte> two = one;
  two.insert(two.end(), one.begin(), one.end());
  r = decode_request(two);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find(std::to_string(one.size()) + " bytes after the message"),
            std::string::npos)
      << r.error().message;
}

TEST(LocalProtocol, AnErrorReplyCarriesItsCodeByName) {
  for (int c = static_cast<int>(ErrorCode::kInvalid); c <= static_cast<int>(ErrorCode::kInternal);
       ++c) {
    const auto code = static_cast<ErrorCode>(c);
    const std::vector<std::byte> bytes = encode(failure(make_error(code, "why")));
    const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    EXPECT_NE(text.find(to_string(code)), std::string::npos) << "the name is on the wire";
    Result<Reply> r = decode_reply(bytes);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_FALSE(r->ok);
    EXPECT_EQ(r->code, code) << to_string(code);
    EXPECT_EQ(r->error, "why");
    EXPECT_EQ(error_code_named(to_string(code)), code);
  }
  EXPECT_EQ(error_code_named("melted"), ErrorCode::kInternal);
  EXPECT_EQ(error_code_named(""), ErrorCode::kInternal);
  // A reply of a newer node with a code this build does not know: kInternal.
  std::vector<std::byte> bytes = encode(failure(make_error(ErrorCode::kFrozen, "x")));
  std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  text.replace(text.find("frozen"), 6, "molten");
  Result<Reply> r = decode_reply(bytes_of(text));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->code, ErrorCode::kInternal);
}

TEST(LocalProtocol, AReplyRoundTripsWithEveryField) {
  Reply a;
  a.chunk_bytes = 65536;
  a.chunk_size = 16;
  a.pages = 10;
  a.slots = 4;
  a.worker_id = -3;
  a.shm = "/kvnode_x";
  a.location = "LocalCPUBackend";
  a.instance = "inst";
  a.present = {true, false, true};
  a.offsets = {0, -1, 65536};
  a.hashes = {9, 8};
  a.hold = 5;
  a.count = 2;
  a.tokens = 32;
  a.pulled = 1;
  a.since = 12;
  a.peer = "127.0.0.1:9";
  a.data = {std::byte{42}};
  a.save_unfull_chunk = false;
  Result<Reply> b = decode_reply(encode(a));
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_TRUE(b->ok);
  EXPECT_EQ(b->chunk_bytes, a.chunk_bytes);
  EXPECT_EQ(b->chunk_size, a.chunk_size);
  EXPECT_EQ(b->pages, a.pages);
  EXPECT_EQ(b->slots, a.slots);
  EXPECT_EQ(b->worker_id, a.worker_id);
  EXPECT_EQ(b->shm, a.shm);
  EXPECT_EQ(b->location, a.location);
  EXPECT_EQ(b->instance, a.instance);
  EXPECT_EQ(b->present, a.present);
  EXPECT_EQ(b->offsets, a.offsets);
  EXPECT_EQ(b->hashes, a.hashes);
  EXPECT_EQ(b->hold, a.hold);
  EXPECT_EQ(b->count, a.count);
  EXPECT_EQ(b->tokens, a.tokens);
  EXPECT_EQ(b->pulled, a.pulled);
  EXPECT_EQ(b->since, a.since);
  EXPECT_EQ(b->peer, a.peer);
  EXPECT_EQ(b->data, a.data);
  EXPECT_EQ(b->save_unfull_chunk, std::optional<bool>(false));
}

TEST(LocalProtocol, SaveUnfullChunkIsSaidOnlyWhenSet) {
  Reply a;
  Result<Reply> b = decode_reply(encode(a));
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_FALSE(b->save_unfull_chunk.has_value()) << "a reply that does not say (an older node)";
  a.save_unfull_chunk = true;
  b = decode_reply(encode(a));
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_EQ(b->save_unfull_chunk, std::optional<bool>(true));
}

TEST(LocalFraming, TheLengthIsFourBytesLittleEndian) {
  const auto h = frame_header(0x01020304);
  EXPECT_EQ(h[0], std::byte{0x04});
  EXPECT_EQ(h[1], std::byte{0x03});
  EXPECT_EQ(h[2], std::byte{0x02});
  EXPECT_EQ(h[3], std::byte{0x01});
  EXPECT_EQ(frame_length(h), 0x01020304u);
}

// Feeds `wire` into a reader `step` bytes at a time; the frames it yields.
std::vector<std::string> frames_of(const std::string& wire, std::size_t step) {
  FrameReader reader;
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < wire.size()) {
    const std::span<std::byte> space = reader.space();
    EXPECT_FALSE(space.empty());
    const std::size_t n = std::min({step, space.size(), wire.size() - at});
    std::memcpy(space.data(), wire.data() + at, n);
    at += n;
    const FrameReader::Progress p = reader.advance(n);
    EXPECT_NE(p, FrameReader::Progress::kTooLarge);
    if (p == FrameReader::Progress::kFrame) {
      const std::vector<std::byte> f = reader.take();
      out.emplace_back(reinterpret_cast<const char*>(f.data()), f.size());
      EXPECT_FALSE(reader.mid_frame());
    } else {
      EXPECT_TRUE(reader.mid_frame());
    }
  }
  return out;
}

std::string framed(const std::string& payload) {
  const auto h = frame_header(static_cast<std::uint32_t>(payload.size()));
  return std::string(reinterpret_cast<const char*>(h.data()), h.size()) + payload;
}

TEST(LocalFraming, FramesArriveWholeHoweverTheBytesAreSplit) {
  const std::string big(300'000, 'x');
  const std::string wire = framed("hello") + framed("") + framed(big) + framed("end");
  for (const std::size_t step : {std::size_t{1}, std::size_t{3}, std::size_t{4096}, wire.size()}) {
    const std::vector<std::string> frames = frames_of(wire, step);
    ASSERT_EQ(frames.size(), 4u) << step;
    EXPECT_EQ(frames[0], "hello");
    EXPECT_EQ(frames[1], "");
    EXPECT_EQ(frames[2], big);
    EXPECT_EQ(frames[3], "end");
  }
}

TEST(LocalFraming, AnOversizedLengthIsRefusedBeforeAnythingIsAllocated) {
  for (const std::uint32_t length :
       {static_cast<std::uint32_t>(kMaxMessageBytes + 1), std::uint32_t{0xffffffff}}) {
    FrameReader reader;
    const auto h = frame_header(length);
    std::memcpy(reader.space().data(), h.data(), h.size());
    EXPECT_EQ(reader.advance(h.size()), FrameReader::Progress::kTooLarge) << length;
    EXPECT_EQ(reader.declared(), length);
  }
  // At the limit it is a frame to read, whose buffer grows with what arrives: a peer that
  // declares 272 MiB and sends 10 bytes costs 64 KiB.
  FrameReader reader;
  const auto h = frame_header(static_cast<std::uint32_t>(kMaxMessageBytes));
  std::memcpy(reader.space().data(), h.data(), h.size());
  EXPECT_EQ(reader.advance(h.size()), FrameReader::Progress::kMore);
  EXPECT_LE(reader.space().size(), 64u << 10);
  EXPECT_EQ(reader.advance(10), FrameReader::Progress::kMore);
  EXPECT_LE(reader.space().size(), 64u << 10);
}

}  // namespace
}  // namespace kvnode::client::protocol
