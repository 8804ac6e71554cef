// kvctl's orchestrator commands: lookup, move, clear, pin, health, check-finish, workers and
// key-stats against a controller's HTTP API (kvcontroller's or LMCache's: the same paths and
// JSON). Human-readable output by default, the controller's JSON with --json. Exit 0 on success,
// 1 when the controller cannot be reached or answers an error (printed; also a health code other
// than 0 and a check-finish of a failed call), 2 on bad input, 3 when a move moved less than the
// source held (kExitPartialMove).
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_support.hpp"
#include "commands.hpp"

namespace kvctl {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Target {
  std::string controller = "127.0.0.1:9000";
  bool json_out = false;
  double timeout_s = 60;
};

std::pair<std::string, int> split_host_port(const std::string& hp) {
  const auto colon = hp.rfind(':');
  if (colon == std::string::npos || colon == 0)
    fail(2, "--controller: expected host:port, got '" + hp + "'");
  try {
    const int port = std::stoi(hp.substr(colon + 1));
    if (port <= 0 || port > 65535) throw std::out_of_range("port");
    return {hp.substr(0, colon), port};
  } catch (const std::exception&) {
    fail(2, "--controller: bad port in '" + hp + "'");
  }
}

// kvctl's exit status for a move that moved only part of what the source held (the destination
// full, dead or frozen): the rest stays at the source. 1 is an error answer, 2 bad input.
constexpr int kExitPartialMove = 3;

// One HTTP call: the status and the parsed body (discarded when not JSON). No answer at all
// exits 1.
struct Answer {
  int status = 0;
  json body;
  std::string raw;
};

Answer call_raw(const Target& t, const std::string& method, const std::string& path,
                const json& body) {
  const auto [host, port] = split_host_port(t.controller);
  httplib::Client client(host, port);
  client.set_connection_timeout(std::chrono::seconds(5));
  const auto timeout = std::chrono::milliseconds(static_cast<long>(t.timeout_s * 1000));
  client.set_read_timeout(timeout);
  client.set_write_timeout(timeout);
  const httplib::Result r =
      method == "GET" ? client.Get(path) : client.Post(path, body.dump(), "application/json");
  if (!r && r.error() == httplib::Error::Connection)
    fail(1, "cannot connect to the controller at " + t.controller +
                " (is it running there? --controller HOST:PORT names it)");
  if (!r)
    fail(1, "no answer from the controller at " + t.controller + path + " (" +
                httplib::to_string(r.error()) + ")");
  return Answer{r->status, json::parse(r->body, nullptr, /*allow_exceptions=*/false), r->body};
}

// An error answer's detail: FastAPI's string, or its validation list as "loc: msg; ...".
std::string detail_text(const Answer& a) {
  if (!a.body.is_object() || !a.body.contains("detail")) return a.raw;
  const json& d = a.body["detail"];
  if (d.is_string()) return d.get<std::string>();
  if (!d.is_array()) return d.dump();
  std::string out;
  for (const json& e : d) {
    std::string where;
    if (e.is_object() && e.contains("loc") && e["loc"].is_array())
      for (const json& part : e["loc"])
        where +=
            (where.empty() ? "" : ".") + (part.is_string() ? part.get<std::string>() : part.dump());
    const std::string msg = e.is_object() && e.contains("msg") && e["msg"].is_string()
                                ? e["msg"].get<std::string>()
                                : e.dump();
    out += (out.empty() ? "" : "; ") + (where.empty() ? msg : where + ": " + msg);
  }
  return out;
}

// The body of a 200 answer; any other status or a body that is not JSON exits 1, saying why.
json ok_body(Answer a, const std::string& path) {
  if (a.status != 200) fail(1, path + ": HTTP " + std::to_string(a.status) + ": " + detail_text(a));
  if (a.body.is_discarded()) fail(1, path + ": the controller answered something that is not JSON");
  return std::move(a.body);
}

json call(const Target& t, const std::string& method, const std::string& path,
          const json& body = {}) {
  return ok_body(call_raw(t, method, path, body), path);
}

void print(const Target& t, const json& j, const std::string& human) {
  if (t.json_out)
    std::cout << j.dump() << "\n";
  else
    std::cout << human << "\n";
}

// A field of a JSON object as text ("-" when absent or null), for the tables below.
std::string text_of(const json& j, const char* field) {
  if (!j.is_object() || !j.contains(field) || j[field].is_null()) return "-";
  return j[field].is_string() ? j[field].get<std::string>() : j[field].dump();
}

// GET /controller/workers as a table, a row per worker (seconds since its last heartbeat).
std::string workers_table(const json& j) {
  const json workers = j.value("workers", json::array());
  if (!workers.is_array() || workers.empty()) return "no workers registered";
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::ostringstream out;
  out << "instance\tworker\tip:port\tpeer_init_url\tkeys\tlast heartbeat\n";
  for (const json& w : workers) {
    const double beat = w.value("last_heartbeat_time", 0.0);
    out << text_of(w, "instance_id") << '\t' << text_of(w, "worker_id") << '\t' << text_of(w, "ip")
        << ':' << text_of(w, "port") << '\t' << text_of(w, "peer_init_url") << '\t'
        << text_of(w, "key_count") << '\t';
    if (beat > 0)
      out << static_cast<long long>(now - beat) << " s ago";
    else
      out << "never";
    out << '\n';
  }
  out << text_of(j, "total_count") << " workers";
  return out.str();
}

// GET /controller/key-stats as a table, a row per instance, then the totals.
std::string key_stats_table(const json& j) {
  std::ostringstream out;
  out << "instance\tkeys\tworkers\n";
  for (const json& i : j.value("instances", json::array()))
    out << text_of(i, "instance_id") << '\t' << text_of(i, "key_count") << '\t'
        << text_of(i, "worker_count") << '\n';
  out << "total: " << text_of(j, "total_key_count") << " keys, "
      << text_of(j, "total_instance_count") << " instances, " << text_of(j, "total_worker_count")
      << " workers";
  return out.str();
}

// The leading tokens `instance` holds by the controller's index, or nullopt when the lookup
// fails (the move then goes ahead and is judged against the tokens asked).
std::optional<std::int64_t> held_by(const Target& t, const std::string& instance,
                                    const std::vector<std::int64_t>& tokens) {
  try {
    const json j = call(t, "POST", "/lookup", {{"tokens", tokens}});
    const json layout = j.value("layout_info", json::object());
    if (!layout.contains(instance)) return 0;
    const json& where = layout[instance];
    if (!where.is_array() || where.size() < 2 || !where[1].is_number_integer()) return std::nullopt;
    return where[1].get<std::int64_t>();
  } catch (const CLI::RuntimeError&) {  // printed; the move itself still decides
    return std::nullopt;
  }
}

}  // namespace

void add_controller_commands(CLI::App& app) {
  auto target = std::make_shared<Target>();
  auto common = [target](CLI::App* c) {
    c->add_option("--controller", target->controller, "the controller's HTTP host:port")
        ->capture_default_str();
    c->add_flag("--json", target->json_out, "print the controller's JSON");
    c->add_option("--timeout", target->timeout_s, "seconds to wait for an answer")
        ->capture_default_str();
  };

  auto lookup_tokens = std::make_shared<TokenArgs>();
  auto* lookup = app.add_subcommand("lookup", "which instance holds the longest prefix of tokens");
  common(lookup);
  lookup_tokens->add(lookup);
  lookup->callback([target, lookup_tokens] {
    const json j = call(*target, "POST", "/lookup", {{"tokens", lookup_tokens->get()}});
    std::string human;
    const json layout = j.value("layout_info", json::object());
    for (const auto& [instance, where] : layout.items())
      human += instance + "  " + where[0].get<std::string>() + "  " + where[1].dump() + " tokens\n";
    print(*target, j,
          human.empty() ? "no instance holds these tokens" : human.substr(0, human.size() - 1));
  });

  struct MoveArgs {
    std::string from, to, location = "LocalCPUBackend";
    bool copy = false;
    std::size_t chunk_bytes = 0, chunk_size = 256;
    TokenArgs tokens;
  };
  auto m = std::make_shared<MoveArgs>();
  auto* move =
      app.add_subcommand("move", "move (or copy) the stored prefix of tokens between instances");
  common(move);
  move->add_option("--from", m->from, "source instance id")->required();
  move->add_option("--to", m->to, "destination instance id")->required();
  move->add_option("--location", m->location)->capture_default_str();
  move->add_flag("--copy", m->copy, "keep the chunks at the source");
  move->add_option("--chunk-bytes", m->chunk_bytes, "bytes per chunk, to print GB/s");
  move->add_option("--chunk-size", m->chunk_size, "tokens per chunk")->capture_default_str();
  m->tokens.add(move);
  move->callback([target, m] {
    const std::vector<std::int64_t> tokens = m->tokens.get();
    // What the source holds before: a move that confirms less moved only part of it.
    const std::int64_t asked = static_cast<std::int64_t>(tokens.size());
    const std::int64_t held =
        tokens.empty() ? 0 : held_by(*target, m->from, tokens).value_or(asked);
    if (!target->json_out)
      std::cerr << "moving " << tokens.size() << " tokens " << m->from << " -> " << m->to
                << " ...\n";
    const auto t0 = Clock::now();
    // The controller answers when the move is done; on a terminal, show that it is running.
    std::atomic<bool> done{false};
    std::thread progress;
    if (!target->json_out && isatty(STDERR_FILENO))
      progress = std::thread([&] {
        while (!done) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          std::cerr << "\r  " << std::chrono::duration<double>(Clock::now() - t0).count() << " s"
                    << std::flush;
        }
        std::cerr << "\r";
      });
    auto stop_progress = [&] {
      done = true;
      if (progress.joinable()) progress.join();
    };
    json j;
    try {
      j = call(*target, "POST", "/move",
               {{"old_position", {m->from, m->location}},
                {"new_position", {m->to, m->location}},
                {"tokens", tokens},
                {"should_copy", m->copy}});
    } catch (...) {
      stop_progress();
      throw;
    }
    stop_progress();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const std::int64_t moved = j.value("num_tokens", 0);
    std::ostringstream human;
    human << "moved " << moved << " tokens in " << seconds << " s";
    if (m->chunk_bytes && m->chunk_size && moved > 0) {
      const double bytes = static_cast<double>((moved + m->chunk_size - 1) / m->chunk_size) *
                           static_cast<double>(m->chunk_bytes);
      j["gbps"] = bytes / seconds / 1e9;
      // Sizes in MiB as everywhere else (the demo says "chunks of 32 MiB"); rates in GB/s.
      human << " (" << bytes / seconds / 1e9 << " GB/s, " << bytes / (1 << 20) << " MiB)";
    }
    j["seconds"] = seconds;
    const bool partial = moved < held;
    if (partial)
      human << "; partial: " << m->from << " held " << held
            << " of these tokens, the rest stays there (exit " << kExitPartialMove << ")";
    print(*target, j, human.str());
    if (partial) throw CLI::RuntimeError(kExitPartialMove);
  });

  struct InstanceArgs {
    std::string instance, location = "LocalCPUBackend";
    TokenArgs tokens;
  };
  auto cl = std::make_shared<InstanceArgs>();
  auto* clear = app.add_subcommand("clear", "evict every unpinned chunk of an instance's location");
  common(clear);
  clear->add_option("--instance", cl->instance)->required();
  clear->add_option("--location", cl->location)->capture_default_str();
  clear->callback([target, cl] {
    const json j = call(*target, "POST", "/clear",
                        {{"instance_id", cl->instance}, {"location", cl->location}});
    print(*target, j, "cleared " + j.value("num_tokens", json(0)).dump() + " tokens");
  });
  auto pi = std::make_shared<InstanceArgs>();
  auto* pin = app.add_subcommand("pin", "pin the stored prefix of tokens at an instance");
  common(pin);
  pin->add_option("--instance", pi->instance)->required();
  pin->add_option("--location", pi->location)->capture_default_str();
  pi->tokens.add(pin);
  pin->callback([target, pi] {
    const json j = call(
        *target, "POST", "/pin",
        {{"instance_id", pi->instance}, {"location", pi->location}, {"tokens", pi->tokens.get()}});
    print(*target, j, "pinned " + j.value("num_tokens", json(0)).dump() + " tokens");
  });
  auto he = std::make_shared<std::string>();
  auto* health = app.add_subcommand("health", "each worker's health (0 = healthy)");
  common(health);
  health->add_option("--instance", *he)->required();
  health->callback([target, he] {
    const json j = call(*target, "POST", "/health", {{"instance_id", *he}});
    std::string human;
    const json codes = j.value("error_codes", json::object());
    bool healthy = !codes.empty();
    for (const auto& [w, code] : codes.items()) {
      human += "worker " + w + ": " + (code == 0 ? "healthy" : "error " + code.dump()) + "\n";
      healthy = healthy && code == 0;
    }
    print(*target, j,
          human.empty() ? "instance '" + *he + "' has no workers at the controller"
                        : human.substr(0, human.size() - 1));
    if (!healthy) throw CLI::RuntimeError(1);
  });
  auto ev = std::make_shared<std::string>();
  auto* check =
      app.add_subcommand("check-finish", "the outcome of an earlier call, by its event id");
  common(check);
  check->add_option("event_id", *ev)->required();
  check->callback([target, ev] {
    // LMCache 0.5.6's controller answers every /check_finish with HTTP 500 (its executor does not
    // implement it), and its /move, /clear and /pin answer only once done: their answer is the
    // outcome. Say so instead of failing; kvcontroller answers 200 or 404 (unknown event).
    const Answer a = call_raw(*target, "POST", "/check_finish", {{"event_id", *ev}});
    if (a.status == 500) {
      const std::string why =
          "the controller at " + target->controller +
          " does not report call outcomes (/check_finish answered HTTP 500, as LMCache 0.5.6's "
          "does: not implemented there); its /move, /clear and /pin answer only when done, so "
          "their own answer is the outcome";
      print(*target, json{{"status", "unsupported"}, {"detail", why}}, why);
      return;
    }
    const json j = ok_body(a, "/check_finish");
    print(*target, j, j.value("status", j.dump()));
    if (j.value("status", "") == "failed") throw CLI::RuntimeError(1);
  });
  auto* workers = app.add_subcommand("workers", "the registered workers");
  common(workers);
  workers->callback([target] {
    const json j = call(*target, "GET", "/controller/workers");
    print(*target, j, workers_table(j));
  });
  auto* stats = app.add_subcommand("key-stats", "how many keys the controller indexes");
  common(stats);
  stats->callback([target] {
    const json j = call(*target, "GET", "/controller/key-stats");
    print(*target, j, key_stats_table(j));
  });
}

}  // namespace kvctl
