// kvctl: the operator's and orchestrator's command-line tool.
#include <iostream>

#include "cli_support.hpp"
#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kvctl: the kvnode operator's tool"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(KVNODE_VERSION));
  kvctl::add_msg_commands(app);
  kvctl::add_keys_commands(app);
  kvctl::add_doctor_command(app);
  kvctl::add_controller_commands(app);
  kvctl::add_node_commands(app);
  // Checked first: CLI11 would report the missing subcommand, not the flag it could not place.
  if (auto unknown = kvctl::unknown_top_level_argument(app, {argv + 1, argv + argc})) {
    std::cerr << "kvctl: " << *unknown << "\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {  // a command failed; it printed why
    return e.get_exit_code();
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "kvctl: " << kvctl::usage_error_message(app, e) << "\n";
    return 2;  // usage errors exit 2, like bad input
  }
  return 0;
}
