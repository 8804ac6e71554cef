// Real kvnode processes for the node tests, with kvctl as the client: a node on fixed loopback
// ports (worker REP, transfer plane) registered with a controller, its local socket, and kvctl
// run to completion with its exit code and output. Moves between two of them go through UCX over
// tcp unless same_host is set (then the dialling node maps its peer's pool and copies).
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "node_rig.hpp"
#include "support/child_process.hpp"
#include "support/process.hpp"

namespace kvnode::node::proc {

using namespace rig;

struct NodeProcessOptions {
  std::string p2p_host = "127.0.0.1";
  std::string gigabytes = "0.01";  // the pool: 0.01 GB of 256 KiB chunks
  std::size_t chunk_bytes = 262144;
  std::size_t chunk_size = 16;  // tokens per chunk
  bool same_host = false;       // --same-host auto; else off
  int http_port = -1;           // /metrics and /health; -1: off
  std::vector<std::string> extra;
  // Runs kvnode under this command, e.g. {"/usr/bin/prlimit", "--nofile=80:80", "--"}.
  std::vector<std::string> launcher;
};

// `tag` makes the instance id and the local socket unique to this test process.
class NodeProcess {
 public:
  NodeProcess(const std::string& name, int pull, int reply, const NodeProcessOptions& o = {})
      : instance_(name + "-" + std::to_string(::getpid())),
        socket_("/tmp/kvnode-proc-" + instance_ + ".sock"),
        ports_(free_ports(2)),
        http_port_(o.http_port) {
    std::vector<std::string> args = {KVNODE_PATH,
                                     "--instance-id",
                                     instance_,
                                     "--controller-pull-url",
                                     "127.0.0.1:" + std::to_string(pull),
                                     "--controller-reply-url",
                                     "127.0.0.1:" + std::to_string(reply),
                                     "--worker-ports",
                                     std::to_string(ports_[0]),
                                     "--p2p-host",
                                     o.p2p_host,
                                     "--p2p-init-ports",
                                     std::to_string(ports_[1]),
                                     "--chunk-bytes",
                                     std::to_string(o.chunk_bytes),
                                     "--chunk-size",
                                     std::to_string(o.chunk_size),
                                     "--max-local-cpu-size",
                                     o.gigabytes,
                                     "--heartbeat-time",
                                     "0.5",
                                     "--full-sync-startup-delay",
                                     "0",
                                     "--http-port",
                                     std::to_string(o.http_port),
                                     "--local-socket",
                                     socket_,
                                     "--local-staging-mb",
                                     "1",
                                     "--ucx-tls",
                                     "tcp",
                                     "--ucx-net-devices",
                                     "lo",
                                     "--same-host",
                                     o.same_host ? "auto" : "off"};
    args.insert(args.end(), o.extra.begin(), o.extra.end());
    args.insert(args.begin(), o.launcher.begin(), o.launcher.end());
    process_ = std::make_unique<test::ChildProcess>(args);
  }
  // Its local socket is up (kvctl put waits out the start-up full sync itself).
  bool up() {
    return eventually([&] { return access(socket_.c_str(), F_OK) == 0 || !process_->running(); },
                      30s) &&
           process_->running();
  }
  const std::string& instance() const { return instance_; }
  const std::string& socket() const { return socket_; }
  int worker_port() const { return ports_[0]; }
  pid_t pid() const { return process_->pid(); }  // -1 once it exited and was reaped
  int p2p_port() const { return ports_[1]; }
  std::string peer_init_url() const { return "127.0.0.1:" + std::to_string(ports_[1]); }
  int http_port() const { return http_port_; }
  // A sample of its /metrics (NodeProcessOptions::http_port); -1: absent, or no http port.
  double metric(const std::string& name) const {
    return http_port_ > 0 ? node_metric(http_port_, name) : -1;
  }
  // SIGKILL, and reaped; then what a clean stop removes (its local socket, its staging shared
  // memory) goes too, and the socket's lock file, so a killed node leaves nothing behind.
  bool kill() {
    process_->signal(SIGKILL);
    if (!eventually([&] { return !process_->running(); })) return false;
    std::string staging = "/kvnode" + socket_;  // as the daemon names it
    std::replace(staging.begin() + 1, staging.end(), '/', '_');
    ::shm_unlink(staging.c_str());
    ::unlink(socket_.c_str());
    ::unlink((socket_ + ".lock").c_str());
    return true;
  }
  void signal(int sig) { process_->signal(sig); }
  std::string log() const { return process_->output(); }
  bool running() { return process_->running(); }
  std::string describe_exit() { return process_->describe_exit(); }

 private:
  std::string instance_, socket_;
  std::vector<int> ports_;
  int http_port_;
  std::unique_ptr<test::ChildProcess> process_;
};

inline test::ProcessResult kvctl(std::vector<std::string> args) {
  args.insert(args.begin(), KVCTL_PATH);
  return test::run_process(args, {}, std::chrono::seconds(60));
}

}  // namespace kvnode::node::proc
