// kvctl keys: chunk hashes of token lists (what the controller computes for /lookup) and
// LMCache CacheEngineKey strings.
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "commands.hpp"
#include "kvnode/keys/cache_engine_key.hpp"
#include "kvnode/keys/chunk_hash.hpp"

namespace kvctl {
namespace {

using kvnode::keys::ChunkHashConfig;
using kvnode::wire::WideInt;
using nlohmann::json;

[[noreturn]] void fail(const std::string& message) {
  std::cerr << "kvctl keys: " << message << '\n';
  throw CLI::RuntimeError(2);
}

// Keys and JSON input may hold any bytes: never let dump() throw on invalid UTF-8.
template <class Json>
std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

json to_json(WideInt v) {
  if (v.negative()) return static_cast<std::int64_t>(v.bits());
  return v.bits();  // number_unsigned: exact up to 2^64-1
}

std::optional<WideInt> json_to_wide(const json& j) {
  if (j.type() == json::value_t::number_unsigned)
    return WideInt::from_unsigned(j.get<std::uint64_t>());
  if (j.type() == json::value_t::number_integer) return WideInt::from_signed(j.get<std::int64_t>());
  return std::nullopt;  // floats (incl. integers beyond 2^64), strings, ...
}

// A decimal integer in [-2^63, 2^64-1], as typed on the command line.
std::optional<WideInt> parse_wide(std::string_view s) {
  const char* end = s.data() + s.size();
  if (!s.empty() && s.front() == '-') {
    std::int64_t v = 0;
    const auto [ptr, ec] = std::from_chars(s.data(), end, v);
    if (ec != std::errc() || ptr != end) return std::nullopt;
    return WideInt::from_signed(v);
  }
  std::uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc() || ptr != end || s.empty()) return std::nullopt;
  return WideInt::from_unsigned(v);
}

WideInt wide_option(const std::string& value, const char* option) {
  const auto v = parse_wide(value);
  if (!v) fail(std::string(option) + ": '" + value + "' is not an integer in [-2^63, 2^64-1]");
  return *v;
}

// ---- keys hash ------------------------------------------------------------------------------

struct HashOptions {
  std::string json_lines;
  std::string tokens;
  std::size_t chunk_size = 256;
  std::string init_hash = "0";
  std::string none_hash;
  std::string generation = "lmcache-0.5.6";
  bool no_unfull = false;
};

struct HashRequest {
  std::vector<std::int64_t> tokens;
  ChunkHashConfig cfg;
};

// One JSON line; fields it omits keep the command-line defaults in `defaults`.
kvnode::Result<HashRequest> parse_request(const std::string& line,
                                          const ChunkHashConfig& defaults) {
  json j;
  try {
    j = json::parse(line);
  } catch (const json::parse_error& e) {
    return kvnode::make_error(std::string("invalid JSON: ") + e.what());
  }
  if (!j.is_object()) return kvnode::make_error("expected a JSON object");
  HashRequest req{{}, defaults};
  bool have_tokens = false;
  for (const auto& [name, value] : j.items()) {
    if (name == "tokens") {
      if (!value.is_array()) return kvnode::make_error("\"tokens\" must be an array of integers");
      req.tokens.reserve(value.size());
      for (std::size_t i = 0; i < value.size(); ++i) {
        const auto t = json_to_wide(value[i]);
        const auto t64 = t ? t->as_int64() : std::nullopt;
        if (!t64)
          return kvnode::make_error("token " + std::to_string(i) + " (" + dump(value[i]) +
                                    ") is not an integer in int64 range");
        req.tokens.push_back(*t64);
      }
      have_tokens = true;
    } else if (name == "chunk_size") {
      if (value.type() != json::value_t::number_unsigned || value.get<std::uint64_t>() == 0)
        return kvnode::make_error("\"chunk_size\" must be a positive integer, got " + dump(value));
      req.cfg.chunk_size = value.get<std::size_t>();
    } else if (name == "save_unfull_chunk") {
      if (!value.is_boolean())
        return kvnode::make_error("\"save_unfull_chunk\" must be true or false, got " +
                                  dump(value));
      req.cfg.save_unfull_chunk = value.get<bool>();
    } else if (name == "hash_generation") {
      auto generation = value.is_string()
                            ? kvnode::keys::parse_hash_generation(value.get<std::string>())
                            : kvnode::Result<kvnode::keys::HashGeneration>(kvnode::make_error(
                                  kvnode::ErrorCode::kInvalid, "got " + dump(value)));
      if (!generation)
        return kvnode::make_error(kvnode::ErrorCode::kInvalid,
                                  "\"hash_generation\": " + generation.error().message);
      req.cfg.generation = *generation;
    } else if (name == "init_hash" || name == "none_hash") {
      const auto v = json_to_wide(value);
      if (!v)
        return kvnode::make_error("\"" + name + "\" must be an integer in [-2^63, 2^64-1], got " +
                                  dump(value));
      if (name == "init_hash")
        req.cfg.init_hash = *v;
      else
        req.cfg.none_hash = v->bits();  // hash(None) is a Py_hash_t; keep its 64 bits
    }
    // Other fields are ignored, as msgspec ignores unknown keys: a vector file's lines (which
    // also carry their expected "hashes") can be piped in as they are.
  }
  if (!have_tokens) return kvnode::make_error("missing \"tokens\"");
  return req;
}

json hashes_json(const std::vector<WideInt>& hashes) {
  json out = json::array();
  for (const WideInt h : hashes) out.push_back(to_json(h));
  return out;
}

void hash_json_lines(std::istream& in, const ChunkHashConfig& defaults) {
  std::string line;
  std::size_t line_no = 0;
  std::size_t failures = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank
    auto req = parse_request(line, defaults);
    std::string error;
    if (req) {
      auto hashes = kvnode::keys::chunk_hashes(req->tokens, req->cfg);
      if (hashes)
        std::cout << dump(hashes_json(*hashes)) << '\n';
      else
        error = hashes.error().message;
    } else {
      error = req.error().message;
    }
    if (!error.empty()) {
      ++failures;
      error = "line " + std::to_string(line_no) + ": " + error;
      std::cerr << "kvctl keys hash: " << error << '\n';
      std::cout << dump(json{{"error", error}}) << '\n';  // keeps output aligned with input
    }
  }
  std::cout.flush();
  if (in.bad()) fail("hash: reading the input failed");
  if (failures > 0) fail("hash: " + std::to_string(failures) + " bad line(s)");
}

std::vector<std::int64_t> parse_token_list(const std::string& list) {
  std::vector<std::int64_t> tokens;
  std::string_view rest = list;
  if (rest.find_first_not_of(" \t") == std::string_view::npos) return tokens;  // no tokens
  for (std::size_t index = 0;; ++index) {
    const std::size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    const std::size_t b = item.find_first_not_of(" \t");
    const std::size_t e = item.find_last_not_of(" \t");
    item = b == std::string_view::npos ? std::string_view{} : item.substr(b, e - b + 1);
    std::int64_t t = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), t);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size())
      fail("hash --tokens: token " + std::to_string(index) + " ('" + std::string(item) +
           "') is not an integer in int64 range");
    tokens.push_back(t);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return tokens;
}

void run_hash(const HashOptions& o) {
  ChunkHashConfig cfg;
  cfg.chunk_size = o.chunk_size;
  cfg.save_unfull_chunk = !o.no_unfull;
  cfg.init_hash = wide_option(o.init_hash, "--init-hash");
  if (!o.none_hash.empty()) cfg.none_hash = wide_option(o.none_hash, "--none-hash").bits();
  auto generation = kvnode::keys::parse_hash_generation(o.generation);
  if (!generation) fail("hash --hash-generation: " + generation.error().message);
  cfg.generation = *generation;
  if (auto s = kvnode::keys::validate(cfg); !s) fail("hash: " + s.error().message);

  if (!o.json_lines.empty()) {
    if (o.json_lines == "-") return hash_json_lines(std::cin, cfg);
    std::ifstream file(o.json_lines);
    if (!file) fail("hash: cannot open '" + o.json_lines + "': " + std::strerror(errno));
    return hash_json_lines(file, cfg);
  }
  const auto tokens = parse_token_list(o.tokens);
  auto hashes = kvnode::keys::chunk_hashes(tokens, cfg);
  if (!hashes) fail("hash: " + hashes.error().message);
  for (const WideInt h : *hashes) std::cout << h.to_string() << '\n';
}

void add_hash(CLI::App& keys) {
  auto o = std::make_shared<HashOptions>();
  auto* cmd =
      keys.add_subcommand("hash", "Chunk-hash chain of token lists (LMCache's builtin hash)");
  auto* jl = cmd->add_option("--json-lines", o->json_lines,
                             "File ('-' = stdin) of {\"tokens\":[...],\"chunk_size\":N,"
                             "\"save_unfull_chunk\":B,\"init_hash\":H,\"hash_generation\":G,"
                             "\"none_hash\":H} lines; "
                             "prints one JSON array of hashes per line");
  auto* tk =
      cmd->add_option("--tokens", o->tokens, "Comma-separated token ids; prints one hash per line");
  jl->excludes(tk);
  cmd->add_option("--chunk-size", o->chunk_size, "Tokens per chunk (default for JSON lines too)")
      ->capture_default_str();
  cmd->add_option("--init-hash", o->init_hash, "h[-1], LMCache's NONE_HASH")->capture_default_str();
  cmd->add_option(
         "--hash-generation", o->generation,
         std::string(kvnode::keys::hash_generation_choices()) + " (default for JSON lines too)")
      ->capture_default_str();
  cmd->add_option("--none-hash", o->none_hash,
                  "legacy generation: hash(None) of the workers' interpreter (default 4238894112, "
                  "CPython >= 3.12; Debian's python3.11.2: 612812)");
  cmd->add_flag("--no-unfull", o->no_unfull, "Do not hash the last partial chunk");
  cmd->callback([o, jl, tk] {
    if (jl->count() == 0 && tk->count() == 0) fail("hash: give --json-lines FILE or --tokens LIST");
    run_hash(*o);
  });
}

// ---- keys format / keys parse ---------------------------------------------------------------

struct FormatOptions {
  kvnode::keys::CacheEngineKey key;
  std::string hash;
  std::int64_t layer_id = 0;
  bool has_layer_id = false;
  std::vector<std::string> tags;
};

void run_format(FormatOptions o) {
  o.key.chunk_hash = wide_option(o.hash, "--hash");
  if (o.has_layer_id) o.key.layer_id = o.layer_id;
  for (const std::string& tag : o.tags) {
    const std::size_t pct = tag.find('%');
    if (pct == std::string::npos) fail("format --tag: '" + tag + "' is not key%value");
    o.key.tags.emplace_back(tag.substr(0, pct), tag.substr(pct + 1));
  }
  if (auto s = o.key.validate(); !s) fail("format: " + s.error().message);
  std::cout << o.key.to_string() << '\n';
}

void add_format(CLI::App& keys) {
  auto o = std::make_shared<FormatOptions>();
  auto* cmd = keys.add_subcommand("format", "Build a CacheEngineKey string");
  cmd->add_option("--model", o->key.model_name, "Model name")->required();
  cmd->add_option("--world-size", o->key.world_size, "Tensor-parallel world size")->required();
  cmd->add_option("--worker-id", o->key.worker_id, "Worker (rank) id")->required();
  cmd->add_option("--hash", o->hash, "Chunk hash, decimal as the controller sees it")->required();
  cmd->add_option("--dtype", o->key.dtype, "KV dtype (bfloat16, half, ...)")->required();
  auto* layer = cmd->add_option("--layer-id", o->layer_id, "Layer id (LMCache's layer-wise keys)");
  cmd->add_option("--tag", o->tags, "Tag key%value (repeatable)");
  cmd->callback([o, layer] {
    o->has_layer_id = layer->count() > 0;
    run_format(*o);
  });
}

void run_parse(const std::string& text) {
  auto key = kvnode::keys::parse_cache_engine_key(text);
  if (!key) fail("parse: " + key.error().message);
  json tags = json::array();
  for (const auto& [k, v] : key->tags) tags.push_back(json::array({k, v}));
  const nlohmann::ordered_json out = {
      {"model_name", key->model_name},
      {"world_size", key->world_size},
      {"worker_id", key->worker_id},
      {"chunk_hash", to_json(key->chunk_hash)},
      {"chunk_hash_hex", kvnode::keys::format_chunk_hash_hex(key->chunk_hash)},
      {"dtype", key->dtype},
      {"layer_id", key->layer_id ? json(*key->layer_id) : json(nullptr)},
      {"tags", std::move(tags)},
  };
  std::cout << dump(out) << '\n';
}

void add_parse(CLI::App& keys) {
  auto text = std::make_shared<std::string>();
  auto* cmd = keys.add_subcommand("parse", "Print a CacheEngineKey string's fields as JSON");
  cmd->add_option("key", *text, "model@world_size@worker_id@hash_hex@dtype[@layer][@k%v...]")
      ->required();
  cmd->callback([text] { run_parse(*text); });
}

}  // namespace

void add_keys_commands(CLI::App& app) {
  auto* keys = app.add_subcommand("keys", "Chunk hashes and CacheEngineKey strings");
  keys->require_subcommand(1);
  add_hash(*keys);
  add_format(*keys);
  add_parse(*keys);
}

}  // namespace kvctl
