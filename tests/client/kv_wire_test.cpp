// The KV registration's wire form: a layout becomes (allocation, offset) pairs and comes back on
// the node's side at the node's bases; its msgpack form round-trips inside a request with the
// other KV-path fields; hostile values are refused with the field named; HostKvMemory is a
// memfd sealed against shrinking; for_each_run covers a chunk exactly once.
#include "kvnode/client/kv_wire.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kvnode/client/kv_layout.hpp"
#include "kvnode/client/kv_memory.hpp"
#include "kvnode/client/local_protocol.hpp"

namespace kvnode::client {
namespace {

constexpr KvCacheShape kShape{10, 4, 2, 8, 2};  // blocks, block size, heads, head size, elem

struct TwoLayers {
  HostKvMemory memory;
  KvLayout layout;
};

// Two layers of vLLM flash-attn tensors in one memfd, the second at an offset.
TwoLayers two_layers() {
  const std::size_t tensor = 2ull * 10 * 4 * 2 * 8 * 2;
  Result<HostKvMemory> m = HostKvMemory::create(2 * tensor + 128, "kv-wire-test");
  EXPECT_TRUE(m) << m.error().message;
  const KvBuffer layers[] = {{m->data(), m->size(), 0}, {m->data(), m->size(), tensor + 128}};
  Result<KvLayout> l = vllm_flash_attn_layout(kShape, layers);
  EXPECT_TRUE(l) << l.error().message;
  return {std::move(m).value(), std::move(l).value()};
}

TEST(KvWire, ALayoutComesBackAtTheNodesBases) {
  TwoLayers c = two_layers();
  const KvAllocation alloc = c.memory.allocation();
  Result<KvWireLayout> w = to_wire(c.layout, std::span(&alloc, 1));
  ASSERT_TRUE(w) << w.error().message;
  EXPECT_EQ(w->fd_count(), 1u);
  ASSERT_EQ(w->tensors.size(), 4u);
  EXPECT_EQ(w->tensors[2].offset, c.layout.layers[1].k.offset);

  std::vector<std::byte> elsewhere(c.memory.size());
  std::byte* const bases[] = {elsewhere.data()};
  const std::size_t sizes[] = {elsewhere.size()};
  Result<KvLayout> back = from_wire(*w, bases, sizes);
  ASSERT_TRUE(back) << back.error().message;
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back->layers[i].k.base, elsewhere.data());
    EXPECT_EQ(back->layers[i].v.offset, c.layout.layers[i].v.offset);
    EXPECT_EQ(back->layers[i].v.block_stride, c.layout.layers[i].v.block_stride);
  }
  // A node that mapped less than the layout needs refuses it, naming the field.
  const std::size_t small[] = {elsewhere.size() / 2};
  Result<KvLayout> short_map = from_wire(*w, bases, small);
  ASSERT_FALSE(short_map);
  EXPECT_NE(short_map.error().message.find("layers[1]"), std::string::npos)
      << short_map.error().message;
}

TEST(KvWire, ATensorOutsideEveryAllocationIsRefusedByName) {
  TwoLayers c = two_layers();
  KvAllocation alloc = c.memory.allocation();
  std::vector<std::byte> other(64);
  alloc.base = other.data();  // not where the tensors live
  Result<KvWireLayout> w = to_wire(c.layout, std::span(&alloc, 1));
  ASSERT_FALSE(w);
  EXPECT_NE(w.error().message.find("layers[0].k.base"), std::string::npos) << w.error().message;
  EXPECT_FALSE(to_wire(c.layout, {}));
}

TEST(KvWire, ItRoundTripsInsideARequestWithTheKvFields) {
  TwoLayers c = two_layers();
  const KvAllocation alloc = c.memory.allocation();
  protocol::Request q;
  q.op = protocol::LocalOp::kRegisterKv;
  q.kv_layout = to_wire(c.layout, std::span(&alloc, 1)).value();
  q.fds = 1;
  Result<protocol::Request> back = protocol::decode_request(protocol::encode(q));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->op, protocol::LocalOp::kRegisterKv);
  ASSERT_TRUE(back->kv_layout);
  EXPECT_EQ(back->fds, 1u);
  EXPECT_EQ(back->kv_layout->layers, 2u);
  EXPECT_EQ(back->kv_layout->head_size, 8u);
  ASSERT_EQ(back->kv_layout->tensors.size(), 4u);
  EXPECT_EQ(back->kv_layout->tensors[3].offset, q.kv_layout->tensors[3].offset);
  EXPECT_EQ(back->kv_layout->allocations[0].bytes, c.memory.size());

  protocol::Request s;
  s.op = protocol::LocalOp::kLoad;
  s.kv = 3;
  s.hashes = {5, 6};
  s.block_ids = {0, 9, UINT32_MAX};
  s.num_tokens = 7;
  s.retrieve = true;
  s.wait_event.assign(64, std::byte{7});
  s.done_event.assign(64, std::byte{8});
  Result<protocol::Request> sb = protocol::decode_request(protocol::encode(s));
  ASSERT_TRUE(sb) << sb.error().message;
  EXPECT_EQ(sb->kv, 3u);
  EXPECT_EQ(sb->block_ids, s.block_ids);
  EXPECT_EQ(sb->num_tokens, 7u);
  EXPECT_TRUE(sb->retrieve);
  EXPECT_EQ(sb->wait_event, s.wait_event);
  EXPECT_EQ(sb->done_event, s.done_event);

  protocol::Reply r;
  r.kv = 11;
  Result<protocol::Reply> rb = protocol::decode_reply(protocol::encode(r));
  ASSERT_TRUE(rb);
  EXPECT_EQ(rb->kv, 11u);
}

TEST(KvWire, HostileFieldsAreRefusedByName) {
  protocol::Request s;
  s.op = protocol::LocalOp::kStore;
  s.wait_event.assign(63, std::byte{1});  // one byte short of an IPC handle
  Result<protocol::Request> bad = protocol::decode_request(protocol::encode(s));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("wait_event"), std::string::npos) << bad.error().message;

  KvWireLayout w;
  w.layers = 1;
  WireAllocation a;
  a.kind = KvMemoryKind::kCudaIpc;
  a.bytes = 10;
  a.handle.assign(12, std::byte{0});  // not 64 bytes
  w.allocations.push_back(a);
  protocol::Request r;
  r.op = protocol::LocalOp::kRegisterKv;
  r.kv_layout = w;
  bad = protocol::decode_request(protocol::encode(r));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("allocations[0][2]"), std::string::npos)
      << bad.error().message;

  // Tensors naming an allocation that does not exist, and counts that do not match the layers.
  KvWireLayout t;
  t.layers = 1;
  t.num_blocks = t.block_size = t.kv_heads = t.head_size = t.elem_bytes = 1;
  t.tensors = {{0, 0, 2, 2, 2}, {5, 0, 2, 2, 2}};
  std::vector<std::byte> mem(64);
  std::byte* const bases[] = {mem.data()};
  const std::size_t sizes[] = {mem.size()};
  t.allocations.resize(1);
  Result<KvLayout> l = from_wire(t, bases, sizes);
  ASSERT_FALSE(l);
  EXPECT_NE(l.error().message.find("tensors[1]"), std::string::npos) << l.error().message;
  t.tensors.pop_back();
  l = from_wire(t, bases, sizes);
  ASSERT_FALSE(l);
  EXPECT_NE(l.error().message.find("kv_layout.tensors"), std::string::npos) << l.error().message;
  t.layers = 100000;
  EXPECT_FALSE(from_wire(t, bases, sizes));
}

TEST(HostKvMemory, IsAMemfdSealedAgainstShrinking) {
  Result<HostKvMemory> m = HostKvMemory::create(1 << 20);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_TRUE(
      std::all_of(m->data(), m->data() + m->size(), [](std::byte b) { return b == std::byte{0}; }));
  const int seals = ::fcntl(m->fd(), F_GET_SEALS);
  EXPECT_TRUE(seals & F_SEAL_SHRINK);
  EXPECT_TRUE(seals & F_SEAL_SEAL);
  EXPECT_NE(::ftruncate(m->fd(), 4096), 0) << "shrinking must be refused";
  EXPECT_EQ(m->allocation().fd, m->fd());
  EXPECT_EQ(m->allocation().kind, KvMemoryKind::kHostFd);
  EXPECT_FALSE(HostKvMemory::create(0));
}

TEST(KvRuns, CoverAChunkExactlyOnce) {
  TwoLayers c = two_layers();
  const std::vector<std::uint32_t> table = {3, 7, 1};  // 12 tokens
  const std::size_t tokens = 10;
  const std::size_t bytes = chunk_bytes(c.layout, tokens).value();
  std::vector<int> covered(bytes, 0);
  Status s = for_each_run(c.layout, table, 1, tokens, bytes, [&](const KvRun& r) {
    for (std::size_t i = 0; i < r.bytes; ++i) ++covered[r.chunk_offset + i];
  });
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_TRUE(std::all_of(covered.begin(), covered.end(), [](int n) { return n == 1; }));
  // Out of range: nothing is visited.
  int calls = 0;
  const std::vector<std::uint32_t> bad = {3, 70, 1};
  EXPECT_FALSE(for_each_run(c.layout, bad, 0, tokens, bytes, [&](const KvRun&) { ++calls; }));
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace kvnode::client
