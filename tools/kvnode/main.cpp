// kvnode: the KV-cache transfer node. Configuration: LMCache's YAML keys and flags (--help);
// docs/operations.md. Exits 0 on SIGTERM/SIGINT, 1 when it cannot start, 2 on a bad command line.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <cstdio>

#include "kvnode/common/allocator.hpp"
#include "kvnode/common/descriptors.hpp"
#include "kvnode/node/daemon.hpp"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  kvnode::Result<kvnode::node::ConfigOrExit> parsed = kvnode::node::load_node_config(args);
  if (!parsed) {
    std::fprintf(stderr, "kvnode: %s\n", parsed.error().message.c_str());
    return 2;
  }
  if (!parsed->config) {
    std::printf("%s\n", parsed->message.c_str());
    return parsed->exit_code;
  }
  for (const std::string& warning : parsed->warnings)
    std::fprintf(stderr, "kvnode: warning: %s\n", warning.c_str());
  spdlog::set_level(spdlog::level::from_str(parsed->config->log_level));
  kvnode::keep_freed_memory();
  kvnode::raise_descriptor_limit();  // before the listeners size their caps from it
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // every thread started below inherits it
  auto daemon = kvnode::node::Daemon::start(*parsed->config);
  if (!daemon) {
    spdlog::error("kvnode: {}", daemon.error().message);
    return 1;
  }
  const kvnode::node::DaemonPorts ports = (*daemon)->ports();
  spdlog::info("kvnode {} rank {}: control on {}, transfers at {}, http on {}",
               parsed->config->lmcache_instance_id, parsed->config->worker_id, ports.worker,
               (*daemon)->peer_init_url(), ports.http);
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("kvnode: signal {}, stopping", sig);
  daemon->reset();
  return 0;
}
