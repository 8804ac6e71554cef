// Real kvnode processes for the node tests, with kvctl as the client: a node on fixed loopback
// ports (worker REP, transfer plane) registered with a controller, its local socket, and kvctl
// run to completion with its exit code and output.
#pragma once

#include <unistd.h>

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
        ports_(free_ports(2)) {
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
                                     "262144",
                                     "--chunk-size",
                                     "16",
                                     "--max-local-cpu-size",
                                     o.gigabytes,
                                     "--heartbeat-time",
                                     "0.5",
                                     "--full-sync-startup-delay",
                                     "0",
                                     "--http-port",
                                     "-1",
                                     "--local-socket",
                                     socket_,
                                     "--local-staging-mb",
                                     "1",
                                     "--ucx-tls",
                                     "tcp",
                                     "--ucx-net-devices",
                                     "lo"};
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
  std::string log() const { return process_->output(); }
  bool running() { return process_->running(); }
  std::string describe_exit() { return process_->describe_exit(); }

 private:
  std::string instance_, socket_;
  std::vector<int> ports_;
  std::unique_ptr<test::ChildProcess> process_;
};

inline test::ProcessResult kvctl(std::vector<std::string> args) {
  args.insert(args.begin(), KVCTL_PATH);
  return test::run_process(args, {}, std::chrono::seconds(60));
}

}  // namespace kvnode::node::proc
