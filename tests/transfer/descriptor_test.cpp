// The peer descriptor codec: round trip, and bytes off the network treated as hostile.
#include "descriptor.hpp"

#include <gtest/gtest.h>

#include "support/must.hpp"

namespace kvnode::transfer {
namespace {

using test::must;

TEST(Descriptor, RoundTripAndHostileInput) {
  PeerDescriptor d;
  d.node = "10.0.0.5:5555";
  d.worker_address = {std::byte{1}, std::byte{2}};
  d.rkey = {std::byte{3}};
  d.base = 1 << 20;
  d.page_bytes = 32 << 20;
  d.pages = 100;
  d.host = host_identity();
  d.instance = 0xfeedface12345678ull;
  const PeerDescriptor back = must(decode_descriptor(encode(d)));
  EXPECT_EQ(back.node, d.node);
  EXPECT_EQ(back.worker_address, d.worker_address);
  EXPECT_EQ(back.rkey, d.rkey);
  EXPECT_EQ(back.base, d.base);
  EXPECT_EQ(back.page_bytes, d.page_bytes);
  EXPECT_EQ(back.pages, d.pages);
  EXPECT_EQ(back.host, d.host);
  EXPECT_FALSE(d.host.empty());
  EXPECT_EQ(back.instance, d.instance);

  auto error_of = [](const ucx::Bytes& b) {
    const auto r = decode_descriptor(b);
    return r ? std::string("accepted") : r.error().message;
  };
  EXPECT_NE(error_of({}).find("not msgpack"), std::string::npos);
  EXPECT_EQ(error_of(encode_refusal("pool full")), "refused: pool full");
  EXPECT_NE(error_of({std::byte{0x90}}).find("expected a map"), std::string::npos);
  PeerDescriptor bad = d;
  bad.rkey.clear();
  EXPECT_EQ(error_of(encode(bad)), "descriptor.rkey: empty");
  bad = d;
  bad.base = ~0ull - 10;
  EXPECT_NE(error_of(encode(bad)).find("wraps"), std::string::npos);
  // A bin header claiming 4 GiB with 3 bytes behind it: no allocation, an error.
  const ucx::Bytes lying{std::byte{0x81}, std::byte{0xa4}, std::byte{'r'},  std::byte{'k'},
                         std::byte{'e'},  std::byte{'y'},  std::byte{0xc6}, std::byte{0xff},
                         std::byte{0xff}, std::byte{0xff}, std::byte{0xff}, std::byte{1}};
  EXPECT_NE(error_of(lying), "accepted");
}

// Same-host fields: an offer round-trips; a peer without one (older, or same_host off) decodes
// with none; an offer without its token, a kind out of range, a name too long are refused.
TEST(Descriptor, SameHostOfferRoundTripsAndIsCheckedLikeTheRest) {
  PeerDescriptor d;
  d.node = "10.0.0.5:5555";
  d.worker_address = {std::byte{1}};
  d.rkey = {std::byte{3}};
  d.page_bytes = 4096;
  d.pages = 4;
  d.pool_kind = 2;
  d.device = 3;
  const PeerDescriptor plain = must(decode_descriptor(encode(d)));
  EXPECT_TRUE(plain.share.empty());
  EXPECT_EQ(plain.pool_kind, 2);
  EXPECT_EQ(plain.device, 3u);

  d.share = "kvnode-pool-0123456789abcdef";
  for (std::size_t i = 0; i < d.share_token.size(); ++i)
    d.share_token[i] = static_cast<std::byte>(0xa0 + i);
  const PeerDescriptor back = must(decode_descriptor(encode(d)));
  EXPECT_EQ(back.share, d.share);
  EXPECT_EQ(back.share_token, d.share_token);

  auto patched = [&](const std::string& from, const std::string& to) {
    ucx::Bytes b = encode(d);
    const std::string text(reinterpret_cast<const char*>(b.data()), b.size());
    const std::size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos)
      for (std::size_t i = 0; i < to.size(); ++i) b[at + i] = static_cast<std::byte>(to[i]);
    return decode_descriptor(b);
  };
  // The token's key renamed: an unknown key (ignored), so the offer has no token.
  const auto no_token = patched("share_token", "share_tokeX");
  ASSERT_FALSE(no_token);
  EXPECT_EQ(no_token.error().message, "descriptor.share_token: missing");
  // pool_kind 2 -> 3: no such memory kind.
  const auto bad_kind = patched(std::string("pool_kind\x02", 10), std::string("pool_kind\x03", 10));
  ASSERT_FALSE(bad_kind);
  EXPECT_EQ(bad_kind.error().message, "descriptor.pool_kind: out of range");
  PeerDescriptor long_name = d;
  long_name.share.assign(108, 'x');
  const auto too_long = decode_descriptor(encode(long_name));
  ASSERT_FALSE(too_long);
  EXPECT_EQ(too_long.error().message, "descriptor.share: longer than 107 bytes");
}

}  // namespace
}  // namespace kvnode::transfer
