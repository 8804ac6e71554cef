// kvctl's command groups. Each group adds its subcommands to the app; a command that fails
// prints its error on stderr and throws CLI::RuntimeError with the exit code (2 for bad input).
#pragma once

#include <CLI/CLI.hpp>

namespace kvctl {

void add_msg_commands(CLI::App& app);    // msg decode / msg encode (wire debugging)
void add_keys_commands(CLI::App& app);   // keys hash / keys format / keys parse
void add_doctor_command(CLI::App& app);  // doctor: what this host offers (UCX, RDMA, CUDA)
// lookup, move, clear, pin, health, check-finish, workers, key-stats: a controller's HTTP API
void add_controller_commands(CLI::App& app);
// put, get, verify: a node on this host, over its local socket
void add_node_commands(CLI::App& app);

}  // namespace kvctl
