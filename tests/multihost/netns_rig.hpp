// The multi-host rig: hosts made of Linux network namespaces, one per host, each joined by a veth
// pair to a bridge in a namespace of its own (the "switch"), with 10.213.0.0/24 addresses. Every
// name carries the test's pid, so runs side by side never meet; the destructor removes all of it
// (also after a failed assertion), and a start removes what a killed run left behind.
// Processes run as `ip netns exec NS program ...` (ip execs the program: the child's pid is the
// program's), so a host's processes see only its address and the bridge.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/child_process.hpp"
#include "support/eventually.hpp"
#include "support/process.hpp"

namespace kvnode::multihost {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

inline bool eventually(const std::function<bool()>& c, Clock::duration patience) {
  return test::eventually(c, patience, 50ms);  // conditions here run commands in namespaces
}

// iproute2's ip, or "" where it is not installed.
inline std::string ip_binary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (::access(p, X_OK) == 0) return p;
  return {};
}

// Runs `ip args...`; "" on success, else the command and what it said.
inline std::string ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {ip_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  const test::ProcessResult r = test::run_process(argv, {}, 20s);
  if (r.exit_code == 0) return {};
  std::string cmd = "ip";
  for (const auto& a : args) cmd += " " + a;
  return "`" + cmd + "` failed (exit " + std::to_string(r.exit_code) + "): " + r.err + r.out;
}

// Names this run's resources start with; a run's pid follows the stem.
inline constexpr const char* kStem = "kvmh";

// Files named after this run under a directory (local sockets in /tmp, staging in /dev/shm).
inline void remove_files_named(const std::string& dir, const std::string& fragment) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  std::vector<std::string> doomed;
  while (const dirent* e = ::readdir(d))
    if (std::strstr(e->d_name, fragment.c_str())) doomed.push_back(dir + "/" + e->d_name);
  ::closedir(d);
  for (const auto& p : doomed) ::unlink(p.c_str());
}

// Removes what runs that are gone (killed by a timeout) left: their namespaces (after killing the
// processes still in them), local sockets and shared-memory staging regions.
inline void remove_leftovers() {
  std::vector<std::string> stale;
  {
    const std::string ip_path = ip_binary();
    const test::ProcessResult r = test::run_process({ip_path, "netns", "list"}, {}, 20s);
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      const std::string name = line.substr(0, line.find(' '));
      if (name.rfind(kStem, 0) != 0) continue;
      const std::string rest = name.substr(std::strlen(kStem));
      const long pid = std::strtol(rest.c_str(), nullptr, 10);
      if (pid > 0 && pid != ::getpid() && ::kill(static_cast<pid_t>(pid), 0) != 0)
        stale.push_back(name);
    }
  }
  for (const std::string& ns : stale) {
    const test::ProcessResult pids = test::run_process({ip_binary(), "netns", "pids", ns}, {}, 20s);
    std::istringstream in(pids.out);
    for (long pid = 0; in >> pid;)
      if (pid > 1) ::kill(static_cast<pid_t>(pid), SIGKILL);
    (void)ip({"netns", "del", ns});
  }
  for (const std::string& ns : stale) {
    const std::string run = ns.substr(0, ns.find('-') + 1);  // "kvmh<pid>-"
    remove_files_named("/tmp", run);
    remove_files_named("/dev/shm", run);
  }
}

// One host: a namespace, its end of a veth pair (kIface) with an address, the other end in the
// bridge's namespace, named after the host.
struct Host {
  std::string name;  // "ctl", "n1", ...
  std::string ns;    // the namespace
  std::string addr;  // 10.213.0.x
  std::string port;  // its veth end in the bridge's namespace (the switch port)
};

class Topology {
 public:
  static constexpr const char* kIface = "veth0";  // every host's interface, inside its namespace

  // Builds the bridge and one host per name; error() says what failed (nothing is left behind).
  explicit Topology(const std::vector<std::string>& hosts)
      : prefix_(std::string(kStem) + std::to_string(::getpid())), bridge_ns_(prefix_ + "-br") {
    error_ = build(hosts);
    if (!error_.empty()) teardown();
  }
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;
  ~Topology() { teardown(); }

  const std::string& error() const { return error_; }
  const std::string& prefix() const { return prefix_; }
  const Host& host(const std::string& name) const {
    for (const Host& h : hosts_)
      if (h.name == name) return h;
    throw std::out_of_range("no host " + name);
  }
  // Cuts (or restores) a host's cable: its switch port goes down (up).
  std::string set_link(const std::string& name, bool up) {
    return ip({"-n", bridge_ns_, "link", "set", host(name).port, up ? "up" : "down"});
  }

 private:
  std::string build(const std::vector<std::string>& hosts) {
    if (auto e = ip({"netns", "add", bridge_ns_}); !e.empty()) return e;
    namespaces_.push_back(bridge_ns_);
    for (const auto& args : std::vector<std::vector<std::string>>{
             {"-n", bridge_ns_, "link", "set", "lo", "up"},
             {"-n", bridge_ns_, "link", "add", "br0", "type", "bridge"},
             {"-n", bridge_ns_, "link", "set", "br0", "up"}})
      if (auto e = ip(args); !e.empty()) return e;
    int octet = 1;
    for (const std::string& name : hosts) {
      Host h{name, prefix_ + "-" + name, "10.213.0." + std::to_string(octet++), name};
      if (auto e = ip({"netns", "add", h.ns}); !e.empty()) return e;
      namespaces_.push_back(h.ns);
      // Both ends are made straight in their namespaces, so their names clash with nothing.
      for (const auto& args : std::vector<std::vector<std::string>>{
               {"link", "add", kIface, "netns", h.ns, "type", "veth", "peer", "name", h.port,
                "netns", bridge_ns_},
               {"-n", bridge_ns_, "link", "set", h.port, "master", "br0"},
               {"-n", bridge_ns_, "link", "set", h.port, "up"},
               {"-n", h.ns, "addr", "add", h.addr + "/24", "dev", kIface},
               {"-n", h.ns, "link", "set", kIface, "up"},
               {"-n", h.ns, "link", "set", "lo", "up"}})
        if (auto e = ip(args); !e.empty()) return e;
      hosts_.push_back(h);
    }
    return {};
  }
  void teardown() {
    // A namespace outlives its name while processes run in it: kill those first.
    for (auto it = namespaces_.rbegin(); it != namespaces_.rend(); ++it) {
      const test::ProcessResult pids =
          test::run_process({ip_binary(), "netns", "pids", *it}, {}, 20s);
      std::istringstream in(pids.out);
      for (long pid = 0; in >> pid;)
        if (pid > 1 && pid != ::getpid()) ::kill(static_cast<pid_t>(pid), SIGKILL);
      (void)ip({"netns", "del", *it});
    }
    namespaces_.clear();
    hosts_.clear();
  }

  std::string prefix_, bridge_ns_, error_;
  std::vector<std::string> namespaces_;
  std::vector<Host> hosts_;
};

// A server process on a host: `ip netns exec NS argv...`, started again with the same argv.
class HostProcess {
 public:
  HostProcess(const Host& host, std::vector<std::string> argv) : host_(host) {
    argv_ = {ip_binary(), "netns", "exec", host.ns};
    argv_.insert(argv_.end(), argv.begin(), argv.end());
  }
  void start() {
    process_.reset();
    process_ = std::make_unique<test::ChildProcess>(argv_);
  }
  bool running() { return process_ && process_->running(); }
  void signal(int sig) {
    if (process_) process_->signal(sig);
  }
  // Sends `sig` and waits for the exit: its code, or nullopt (killed after `patience`, or it died
  // from a signal).
  std::optional<int> stop(int sig, std::chrono::milliseconds patience) {
    if (!process_) return std::nullopt;
    return process_->stop(sig, patience);
  }
  std::string describe_exit() { return process_ ? process_->describe_exit() : std::string(); }
  bool kill() {
    if (!process_) return true;
    process_->signal(SIGKILL);
    return eventually([&] { return !process_->running(); }, 10s);
  }
  // Every run's output so far (earlier runs' logs are kept when it restarts).
  std::string log() const { return earlier_ + (process_ ? process_->output() : std::string()); }
  void keep_log() {
    if (process_) earlier_ += process_->output() + "---- (restarted) ----\n";
  }
  const Host& host() const { return host_; }
  // The program's pid: the process in its host's namespace running it (ip execs the program, so
  // it is the child itself); -1 when there is none.
  pid_t pid() const {
    std::string program = argv_[4].substr(argv_[4].rfind('/') + 1);
    program = program.substr(0, 15);  // /proc/PID/comm keeps 15 characters
    const test::ProcessResult r =
        test::run_process({ip_binary(), "netns", "pids", host_.ns}, {}, 20s);
    std::istringstream in(r.out);
    for (long pid = 0; in >> pid;) {
      std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
      std::string name;
      std::getline(comm, name);
      if (name == program) return static_cast<pid_t>(pid);
    }
    return -1;
  }

 private:
  Host host_;
  std::vector<std::string> argv_;
  std::unique_ptr<test::ChildProcess> process_;
  std::string earlier_;
};

// The state of a process from /proc: 'R', 'S', 'T' (stopped), ...; '?' when gone.
inline char proc_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  std::getline(in, s);
  const auto close = s.rfind(')');
  return close == std::string::npos || close + 2 >= s.size() ? '?' : s[close + 2];
}

}  // namespace kvnode::multihost
