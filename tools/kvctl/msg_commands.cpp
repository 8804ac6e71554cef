// kvctl msg decode / msg encode: the wire codec on the command line, for people reading captures
// and for tests. JSON is msgspec's to_builtins(msg, str_keys=True) form.
#include <iostream>
#include <iterator>
#include <optional>
#include <string>

#include "commands.hpp"
#include "kvnode/wire/codec.hpp"
#include "kvnode/wire/json.hpp"
#include "line_input.hpp"

namespace kvctl {
namespace {

using kvnode::Result;
using kvnode::wire::Json;

using Root = kvnode::wire::Root;

// JSON text -> canonical msgpack (decoding validates it exactly as a received message would be).
Result<std::string> encode_json(std::string_view json, Root root) {
  auto trimmed = json.substr(std::min(json.find_first_not_of(" \t\r\n"), json.size()));
  if (trimmed.empty() || trimmed.front() != '{')
    return kvnode::make_error("expected a JSON object");
  return kvnode::wire::reencode(trimmed, root);
}

std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

[[noreturn]] void fail(const std::string& message) {
  std::cerr << "kvctl: " << message << "\n";
  throw CLI::RuntimeError(2);
}

struct Options {
  std::optional<std::string> hex;
  std::optional<std::string> lines_file;
  bool hex_output = false;
  Root root = Root::kMsg;
};

void add_root_option(CLI::App* cmd, Options& o) {
  const std::map<std::string, Root> roots{
      {"Msg", Root::kMsg}, {"KVOpEvent", Root::kKVOpEvent}, {"AnyCommand", Root::kAnyCommand}};
  cmd->add_option("--as", o.root, "Root type: Msg (default), KVOpEvent or AnyCommand")
      ->transform(CLI::CheckedTransformer(roots));
}

void run_decode(const Options& o) {
  if (o.lines_file) {  // one result per line; errors are data here, so exit 0
    for_each_line(*o.lines_file, BlankLines::kKeep, [&](std::size_t, std::string_view line) {
      auto bytes = hex_decode(line);
      Result<Json> r = bytes ? kvnode::wire::decode_to_builtins(*bytes, o.root)
                             : Result<Json>(std::move(bytes).error());
      Json out = Json::object();
      out["ok"] = r.ok();
      if (r)
        out["value"] = std::move(*r);
      else
        out["error"] = r.error().message;
      std::cout << dump(out) << "\n";
    });
    return;
  }
  std::string payload;
  if (o.hex) {
    auto bytes = hex_decode(*o.hex);
    if (!bytes) fail(bytes.error().message);
    payload = std::move(*bytes);
  } else {
    payload.assign(std::istreambuf_iterator<char>(std::cin), {});
  }
  auto r = kvnode::wire::decode_to_builtins(payload, o.root);
  if (!r) fail(r.error().message);
  std::cout << dump(*r) << "\n";
}

void run_encode(const Options& o) {
  if (o.lines_file) {  // one hex line per input line; a bad line leaves an empty line
    bool any_failed = false;
    for_each_line(*o.lines_file, BlankLines::kSkip, [&](std::size_t number, std::string_view line) {
      auto r = encode_json(line, o.root);
      if (!r) {
        any_failed = true;
        std::cerr << "kvctl: line " << number << ": " << r.error().message << "\n";
      }
      std::cout << (r ? hex_encode(*r) : "") << "\n";
    });
    if (any_failed) throw CLI::RuntimeError(2);
    return;
  }
  const std::string json(std::istreambuf_iterator<char>(std::cin), {});
  auto r = encode_json(json, o.root);
  if (!r) fail(r.error().message);
  if (o.hex_output)
    std::cout << hex_encode(*r) << "\n";
  else
    std::cout.write(r->data(), static_cast<std::streamsize>(r->size()));
}

}  // namespace

void add_msg_commands(CLI::App& app) {
  auto* msg = app.add_subcommand("msg", "Encode and decode LMCache controller messages");
  msg->require_subcommand(1);

  auto decode_opts = std::make_shared<Options>();
  auto* decode = msg->add_subcommand("decode", "msgpack (stdin, --hex or --hex-lines) -> JSON");
  auto* hex = decode->add_option("--hex", decode_opts->hex, "The message as hex");
  decode
      ->add_option("--hex-lines", decode_opts->lines_file,
                   "File (- = stdin) of hex lines: one JSON result per line")
      ->excludes(hex);
  add_root_option(decode, *decode_opts);
  decode->callback([decode_opts] { run_decode(*decode_opts); });

  auto encode_opts = std::make_shared<Options>();
  auto* encode = msg->add_subcommand("encode", "JSON (stdin or --json-lines) -> msgpack");
  encode->add_flag("--hex", encode_opts->hex_output, "Print hex instead of raw bytes");
  encode->add_option("--json-lines", encode_opts->lines_file,
                     "File (- = stdin) of JSON lines: one hex line each");
  add_root_option(encode, *encode_opts);
  encode->callback([encode_opts] { run_encode(*encode_opts); });
}

}  // namespace kvctl
