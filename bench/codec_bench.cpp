// bench_codec: the wire codec on LMCache's hottest messages, with baselines in the same binary.
// Every case reports items_processed = KV operations (or lookup hashes), so ns/item and items/s
// read side by side:
//   Decode/Encode BatchedKVOperationMsg (50 and 1000 ops), BatchedP2PLookupMsg (1000 hashes),
//   Decode of the same 50-op batch as JSON text,
//   msgpack-cxx: generic msgpack::unpack into an object_handle, unpack + convert into a
//   MSGPACK_DEFINE_MAP struct, and msgpack::pack of that struct (same map layout),
//   memcpy of the encoded bytes (the floor).
// Issue targets: decode and encode of a 50-op batch >= 20 M ops/s (<= 50 ns/op).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <msgpack.hpp>
#include <random>
#include <string>
#include <vector>

#include "kvnode/wire/codec.hpp"
#include "kvnode/wire/json.hpp"

namespace {

namespace wire = kvnode::wire;

constexpr std::int64_t kSeqBase = 123'456'789;  // a worker that has been up for a while

// Chunk hashes as CPython's hash() gives them: uniform int64, so nearly all take 9 bytes.
std::vector<std::int64_t> random_hashes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> out(n);
  for (auto& h : out) h = static_cast<std::int64_t>(rng());
  return out;
}

wire::BatchedKVOperationMsg make_batch(std::size_t n) {
  wire::BatchedKVOperationMsg msg;
  msg.instance_id = "vllm-instance-0";
  msg.worker_id = 0;
  msg.location = "LocalCPUBackend";
  std::mt19937_64 rng(n);
  const auto hashes = random_hashes(n, 42 + n);
  msg.operations.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const bool evict = rng() % 4 == 0;  // mostly admits
    msg.operations.push_back(wire::KVOpEvent{evict ? wire::OpType::kEvict : wire::OpType::kAdmit,
                                             wire::ChunkHash(hashes[i]),
                                             kSeqBase + static_cast<std::int64_t>(i)});
  }
  return msg;
}

wire::BatchedP2PLookupMsg make_lookup(std::size_t n) {
  wire::BatchedP2PLookupMsg msg;
  for (std::int64_t h : random_hashes(n, 7 + n)) msg.hashes.emplace_back(h);
  msg.instance_id = "vllm-instance-0";
  msg.worker_id = 0;
  return msg;
}

std::string encoded(const wire::Msg& msg) {
  return wire::encode(msg);
}

std::size_t item_count(const wire::Msg& msg) {
  if (const auto* b = std::get_if<wire::BatchedKVOperationMsg>(&msg)) return b->operations.size();
  if (const auto* l = std::get_if<wire::BatchedP2PLookupMsg>(&msg)) return l->hashes.size();
  return 1;
}

// ---- kvnode::wire ----

void run_decode(benchmark::State& state, const wire::Msg& msg, const std::string& payload) {
  {
    auto check = wire::decode(payload);
    if (!check.ok() || !(*check == msg)) {
      state.SkipWithError(check.ok() ? "decode mismatch" : check.error().message.c_str());
      return;
    }
  }
  for (auto _ : state) {
    auto result = wire::decode(payload);
    benchmark::DoNotOptimize(result);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * item_count(msg)));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * payload.size()));
}

void run_encode(benchmark::State& state, const wire::Msg& msg) {
  std::string out;
  out.reserve(encoded(msg).size());
  for (auto _ : state) {
    out.clear();  // reused buffer, as the node's send path does
    wire::encode(msg, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * item_count(msg)));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * out.size()));
}

void BM_Decode_BatchedKVOp(benchmark::State& state) {
  const wire::Msg msg = make_batch(static_cast<std::size_t>(state.range(0)));
  run_decode(state, msg, encoded(msg));
}
BENCHMARK(BM_Decode_BatchedKVOp)->Arg(50)->Arg(1000);

void BM_Encode_BatchedKVOp(benchmark::State& state) {
  run_encode(state, make_batch(static_cast<std::size_t>(state.range(0))));
}
BENCHMARK(BM_Encode_BatchedKVOp)->Arg(50)->Arg(1000);

void BM_Decode_P2PLookup(benchmark::State& state) {
  const wire::Msg msg = make_lookup(static_cast<std::size_t>(state.range(0)));
  run_decode(state, msg, encoded(msg));
}
BENCHMARK(BM_Decode_P2PLookup)->Arg(1000);

void BM_Encode_P2PLookup(benchmark::State& state) {
  run_encode(state, make_lookup(static_cast<std::size_t>(state.range(0))));
}
BENCHMARK(BM_Encode_P2PLookup)->Arg(1000);

// The same batch as JSON text (what kvctl and JSON-speaking peers send): transcoded, then decoded.
void BM_DecodeJson_BatchedKVOp(benchmark::State& state) {
  const wire::Msg msg = make_batch(static_cast<std::size_t>(state.range(0)));
  run_decode(state, msg, wire::to_builtins(msg).dump());
}
BENCHMARK(BM_DecodeJson_BatchedKVOp)->Arg(50);

// ---- Baselines: msgpack-cxx and memcpy on the same bytes ----

struct CxxOp {
  std::string op_type;
  std::int64_t key = 0;
  std::int64_t seq_num = 0;
  MSGPACK_DEFINE_MAP(op_type, key, seq_num)
};

struct CxxBatch {
  std::string type;
  std::string instance_id;
  std::int64_t worker_id = 0;
  std::string location;
  std::vector<CxxOp> operations;
  MSGPACK_DEFINE_MAP(type, instance_id, worker_id, location, operations)
};

CxxBatch to_cxx(const wire::BatchedKVOperationMsg& msg) {
  CxxBatch out{std::string(wire::BatchedKVOperationMsg::kTag),
               msg.instance_id,
               msg.worker_id,
               msg.location,
               {}};
  for (const auto& op : msg.operations) {
    out.operations.push_back(CxxOp{op.op_type == wire::OpType::kAdmit ? "admit" : "evict",
                                   *op.key.as_int64(), op.seq_num});
  }
  return out;
}

// Generic parse into msgpack-cxx's dynamic object tree (no schema, no validation).
void BM_MsgpackCxx_Unpack_BatchedKVOp(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::string payload = encoded(make_batch(n));
  for (auto _ : state) {
    msgpack::object_handle handle = msgpack::unpack(payload.data(), payload.size());
    benchmark::DoNotOptimize(handle.get().via.map.ptr);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * payload.size()));
}
BENCHMARK(BM_MsgpackCxx_Unpack_BatchedKVOp)->Arg(50);

// Parse plus convert into a MSGPACK_DEFINE_MAP struct: the closest msgpack-cxx gets to a typed
// decode (it still checks less than wire::decode: no tag, enum or range validation).
void BM_MsgpackCxx_UnpackConvert_BatchedKVOp(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::string payload = encoded(make_batch(n));
  for (auto _ : state) {
    msgpack::object_handle handle = msgpack::unpack(payload.data(), payload.size());
    CxxBatch batch = handle.get().as<CxxBatch>();
    benchmark::DoNotOptimize(batch);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * payload.size()));
}
BENCHMARK(BM_MsgpackCxx_UnpackConvert_BatchedKVOp)->Arg(50);

void BM_MsgpackCxx_Pack_BatchedKVOp(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto batch = make_batch(n);
  const CxxBatch cxx = to_cxx(batch);
  msgpack::sbuffer buffer(encoded(batch).size() * 2);
  msgpack::pack(buffer, cxx);
  // Same keys, order and integer widths as wire::encode: the outputs should be byte-identical.
  state.SetLabel(std::string_view(buffer.data(), buffer.size()) == encoded(batch)
                     ? "same bytes as wire::encode"
                     : "bytes differ from wire::encode");
  for (auto _ : state) {
    buffer.clear();
    msgpack::pack(buffer, cxx);
    benchmark::DoNotOptimize(buffer.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * buffer.size()));
}
BENCHMARK(BM_MsgpackCxx_Pack_BatchedKVOp)->Arg(50);

// The floor: copying the encoded bytes.
void BM_Memcpy_BatchedKVOp(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::string payload = encoded(make_batch(n));
  std::vector<char> dst(payload.size());
  for (auto _ : state) {
    std::memcpy(dst.data(), payload.data(), payload.size());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * payload.size()));
}
BENCHMARK(BM_Memcpy_BatchedKVOp)->Arg(50);

}  // namespace
