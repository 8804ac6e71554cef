// kvcontroller: a thin main over kvnode::controller. Exit codes: 0 after SIGINT/SIGTERM (or
// --help/--version), 1 when the controller cannot start (a port in use), 2 for a bad config.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <iostream>
#include <string>
#include <vector>

#include "kvnode/common/allocator.hpp"
#include "kvnode/common/descriptors.hpp"
#include "kvnode/controller/config.hpp"
#include "kvnode/controller/controller.hpp"

namespace {

// Blocked before any thread starts, so every thread inherits the mask and only sigwait() below
// ever receives them: no handler runs inside the socket threads.
sigset_t block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

int wait_for_stop_signal(const sigset_t& signals) {
  int signal_number = 0;
  while (sigwait(&signals, &signal_number) != 0) {
  }
  return signal_number;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvnode::controller;
  const auto loaded = load_config(std::vector<std::string>(argv, argv + argc), process_env());
  if (!loaded) {
    std::cerr << "kvcontroller: " << loaded.error().message << "\n";
    return 2;
  }
  if (!loaded->config) {  // --help, --version
    std::cout << loaded->message;
    return loaded->exit_code;
  }
  const ControllerConfig& config = *loaded->config;
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  kvnode::keep_freed_memory();
  kvnode::raise_descriptor_limit();  // before the listeners size their caps from it

  const sigset_t signals = block_stop_signals();
  auto controller = Controller::start(config);
  if (!controller) {
    std::cerr << "kvcontroller: cannot start: " << controller.error().message << "\n";
    return 1;
  }
  const BoundPorts& ports = (*controller)->ports();
  spdlog::info("kvcontroller listening on {}: http {} pull {} reply {} heartbeat {} legacy pull {}",
               config.controller_host, ports.http, ports.pull, ports.reply, ports.heartbeat,
               ports.legacy_pull);

  const int signal_number = wait_for_stop_signal(signals);
  spdlog::info("kvcontroller: signal {} received, stopping", signal_number);
  (*controller)->stop();
  return 0;
}
