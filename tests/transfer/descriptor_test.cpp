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

}  // namespace
}  // namespace kvnode::transfer
