// transfer_test_peer: a remote node for the two-process tests and kvbench. It runs a transfer
// plane over a pool whose pages hold test::fill_pattern(seed, page), writes its url to PORT_FILE
// once ready, and serves until killed. Transports come from UCX_* in the environment, so both
// processes use the same. With `same-host`, the pool is allocated shareable and the plane offers
// it (PlaneOptions::same_host kAuto), so a same-host dialler copies through its mapping.
//   transfer_test_peer PORT_FILE PAGE_BYTES PAGES [PORT [SEED [same-host]]]
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "kvnode/gpu/chunk_pool.hpp"
#include "kvnode/transfer/plane.hpp"
#include "pattern.hpp"

using namespace kvnode;

namespace {

template <class T>
T must(Result<T> r) {
  if (!r) {
    std::fprintf(stderr, "transfer_test_peer: %s\n", r.error().message.c_str());
    std::exit(1);
  }
  return std::move(r).value();
}

unsigned long number(const char* text, unsigned long max) {
  char* end = nullptr;
  const unsigned long v = std::strtoul(text, &end, 10);
  if (end == text || *end != '\0' || v > max) {
    std::fprintf(stderr, "transfer_test_peer: bad number '%s'\n", text);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const bool same_host = argc == 7 && std::string(argv[6]) == "same-host";
  if (argc < 4 || argc > 7 || (argc == 7 && !same_host)) {
    std::fprintf(
        stderr, "usage: transfer_test_peer PORT_FILE PAGE_BYTES PAGES [PORT [SEED [same-host]]]\n");
    return 2;
  }
  gpu::PoolOptions options;
  options.page_bytes = number(argv[2], 1ul << 31);
  options.pages = number(argv[3], 1u << 20);
  options.region.shareable = same_host;
  const auto port = static_cast<std::uint16_t>(argc > 4 ? number(argv[4], 65535) : 0);
  const auto seed = static_cast<std::uint32_t>(argc > 5 ? number(argv[5], 255) : 1);
  gpu::ChunkPool pool = must(gpu::ChunkPool::create(options));
  for (gpu::PageId p = 0; p < pool.page_count(); ++p)
    test::fill_pattern(pool.page(p), pool.page_bytes(), seed, p);
  transfer::PlaneOptions plane_options;
  plane_options.port = port;
  if (same_host) plane_options.same_host = transfer::SameHost::kAuto;
  auto plane = must(transfer::TransferPlane::start(plane_options, pool));
  const std::string file = argv[1];
  {
    std::ofstream out(file + ".tmp");
    out << plane->url() << "\n";
  }
  std::rename((file + ".tmp").c_str(), file.c_str());  // appears whole
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  int sig = 0;
  sigwait(&set, &sig);
  return 0;
}
