// transfer_test_peer PORT_FILE: a remote node for the two-process tests. Holds a 4-page pool
// whose page p byte i is (p * 31 + i) & 0xff, listens on 127.0.0.1 (free port, written to
// PORT_FILE once ready) and progresses its worker until killed. Transports come from UCX_* in
// the environment, so both processes use the same.
#include <cstdio>
#include <fstream>

#include "kvnode/gpu/chunk_pool.hpp"
#include "kvnode/transfer/descriptor.hpp"
#include "kvnode/transfer/listener.hpp"

using namespace kvnode;

template <class T>
T must(Result<T> r) {
  if (!r) {
    std::fprintf(stderr, "transfer_test_peer: %s\n", r.error().message.c_str());
    std::exit(1);
  }
  return std::move(r).value();
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: transfer_test_peer PORT_FILE\n");
    return 2;
  }
  gpu::PoolOptions options;
  options.page_bytes = 256 << 10;
  options.pages = 4;
  gpu::ChunkPool pool = must(gpu::ChunkPool::create(options));
  for (gpu::PageId p = 0; p < 4; ++p)
    for (std::size_t i = 0; i < pool.page_bytes(); ++i)
      pool.page(p)[i] = static_cast<std::byte>((p * 31 + i) & 0xff);
  const auto context = must(transfer::ucx::Context::create());
  const auto worker = must(transfer::ucx::Worker::create(context));
  const auto reg =
      must(transfer::ucx::Registration::map(context, pool.region().data(), pool.region().size()));
  transfer::PeerDescriptor d;
  d.node = "transfer_test_peer";
  d.worker_address = must(worker.address());
  d.rkey = must(reg.packed_rkey());
  d.base = reinterpret_cast<std::uint64_t>(pool.region().data());
  d.page_bytes = pool.page_bytes();
  d.pages = static_cast<std::uint32_t>(pool.page_count());
  auto listener = must(transfer::Listener::bind(worker, "127.0.0.1", 0, transfer::encode(d)));
  {
    std::ofstream out(std::string(argv[1]) + ".tmp");
    out << listener->port() << "\n";
  }
  std::rename((std::string(argv[1]) + ".tmp").c_str(), argv[1]);  // appears whole
  for (;;) listener->progress();
}
