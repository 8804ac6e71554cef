// kvctl msg decode / encode as a user runs them: a real process, real stdin and stdout.
#include <gtest/gtest.h>

#include <sstream>

#include "support/process.hpp"
#include "support/shared_files.hpp"

namespace kvnode {
namespace {

using test::run_process;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(KvctlMsg, DecodeHexLinesMatchesEveryDecodeCase) {
  KVNODE_LOAD_CONFORMANCE_OR_SKIP(cases, "decode_cases.json");
  std::string input;
  for (const auto& c : cases) input += c["input_hex"].get<std::string>() + "\n";
  auto r = run_process({KVCTL_PATH, "msg", "decode", "--hex-lines", "-"}, input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), cases.size());
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto got = nlohmann::json::parse(lines[i]);
    const auto& want = cases[i];
    ASSERT_EQ(got["ok"], want["ok"]) << want["name"] << ": " << lines[i];
    if (want["ok"].get<bool>())
      EXPECT_EQ(got["value"], nlohmann::json(want["value"])) << want["name"];
    else
      EXPECT_EQ(got["error"], want["error"]) << want["name"];
  }
}

TEST(KvctlMsg, EncodeJsonLinesReproducesEveryVector) {
  KVNODE_LOAD_CONFORMANCE_OR_SKIP(vectors, "lmcache_vectors.json");
  for (const char* root : {"Msg", "KVOpEvent", "AnyCommand"}) {
    std::string input;
    std::vector<std::string> want;
    for (const auto& v : vectors) {
      if (v["decode_as"] != root) continue;
      input += v["value"].dump() + "\n";
      want.push_back(v["msgpack_hex"]);
    }
    auto r = run_process({KVCTL_PATH, "msg", "encode", "--as", root, "--json-lines", "-"}, input);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(lines_of(r.out), want) << root;
  }
}

TEST(KvctlMsg, DecodeOneMessageFromStdinOrHex) {
  const std::string hex = "82a474797065a84572726f724d7367a56572726f72a3626164";
  auto from_hex = run_process({KVCTL_PATH, "msg", "decode", "--hex", hex});
  ASSERT_EQ(from_hex.exit_code, 0) << from_hex.err;
  EXPECT_EQ(from_hex.out, "{\"type\":\"ErrorMsg\",\"error\":\"bad\"}\n");
  auto from_stdin = run_process({KVCTL_PATH, "msg", "decode"}, test::from_hex(hex));
  EXPECT_EQ(from_stdin.out, from_hex.out);
}

TEST(KvctlMsg, BadInputPrintsTheErrorAndExits2) {
  auto bad = run_process({KVCTL_PATH, "msg", "decode", "--hex", "c1"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.out, "");
  EXPECT_NE(bad.err.find("invalid opcode '\\xc1' (byte 0)"), std::string::npos) << bad.err;

  auto not_hex = run_process({KVCTL_PATH, "msg", "decode", "--hex", "zz"});
  EXPECT_EQ(not_hex.exit_code, 2);
  EXPECT_NE(not_hex.err.find("invalid hex"), std::string::npos);

  auto bad_line = run_process({KVCTL_PATH, "msg", "encode", "--json-lines", "-"},
                              "{\"type\":\"ErrorMsg\",\"error\":\"x\"}\n{\"type\":\"Nope\"}\n");
  EXPECT_EQ(bad_line.exit_code, 2);
  EXPECT_EQ(lines_of(bad_line.out),
            (std::vector<std::string>{"82a474797065a84572726f724d7367a56572726f72a178", ""}));
  EXPECT_NE(bad_line.err.find("line 2: Invalid value 'Nope' - at `$.type`"), std::string::npos)
      << bad_line.err;

  auto usage = run_process({KVCTL_PATH, "msg", "decode", "--nope"});
  EXPECT_EQ(usage.exit_code, 2);
}

TEST(KvctlMsg, EncodeWritesRawBytesByDefault) {
  auto r = run_process({KVCTL_PATH, "msg", "encode"}, R"({"type":"ErrorMsg","error":"x"})");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, test::from_hex("82a474797065a84572726f724d7367a56572726f72a178"));
}

}  // namespace
}  // namespace kvnode
