// kvctl keys hash as a user runs it: the vector file's own lines piped in, one JSON array out each.
#include <gtest/gtest.h>

#include <sstream>

#include "support/process.hpp"
#include "support/shared_files.hpp"

namespace kvnode {
namespace {

TEST(KvctlKeys, HashJsonLinesMatchesEveryVector) {
  KVNODE_LOAD_CONFORMANCE_OR_SKIP(file, "chunk_hash_vectors.json");
  std::string input;
  for (const auto& c : file["cases"]) input += c.dump() + "\n";  // extra "hashes" key is ignored
  // The vectors come from LMCache releases before 0.5.6.
  auto r = test::run_process(
      {KVCTL_PATH, "keys", "hash", "--hash-generation", "legacy", "--json-lines", "-"}, input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream out(r.out);
  std::size_t i = 0;
  for (std::string line; std::getline(out, line); ++i) {
    ASSERT_LT(i, file["cases"].size());
    EXPECT_EQ(nlohmann::json::parse(line), nlohmann::json(file["cases"][i]["hashes"]))
        << "case " << i;
  }
  EXPECT_EQ(i, file["cases"].size());
}

TEST(KvctlKeys, BadLinesKeepTheOutputAlignedAndExit2) {
  auto r = test::run_process({KVCTL_PATH, "keys", "hash", "--json-lines", "-"},
                             "{\"tokens\":[1,2,3]}\n{\"tokens\":[1],\"chunk_size\":0}\nnot json\n");
  EXPECT_EQ(r.exit_code, 2);
  std::istringstream out(r.out);
  std::string first, second, third;
  std::getline(out, first);
  std::getline(out, second);
  std::getline(out, third);
  EXPECT_EQ(first, "[7754693342585032853]");  // LMCache 0.5.6's chain by default
  EXPECT_NE(second.find("\"error\""), std::string::npos);
  EXPECT_NE(third.find("line 3"), std::string::npos);
  EXPECT_NE(r.err.find("line 2"), std::string::npos) << r.err;
}

TEST(KvctlKeys, HashGenerationPerLineAndOnTheCommandLine) {
  auto lines = test::run_process(
      {KVCTL_PATH, "keys", "hash", "--json-lines", "-"},
      "{\"tokens\":[1,2,3],\"hash_generation\":\"legacy\"}\n{\"tokens\":[1,2,3]}\n"
      "{\"tokens\":[1,2,3],\"hash_generation\":\"new\"}\n");
  EXPECT_EQ(lines.exit_code, 2);
  EXPECT_EQ(lines.out.substr(0, lines.out.find("\n{")),
            "[8373755996035033071]\n[7754693342585032853]");
  EXPECT_NE(lines.out.find("lmcache-0.5.6"), std::string::npos) << lines.out;
  auto flag = test::run_process(
      {KVCTL_PATH, "keys", "hash", "--hash-generation", "legacy", "--tokens", "1,2,3"}, "");
  EXPECT_EQ(flag.exit_code, 0) << flag.err;
  EXPECT_EQ(flag.out, "8373755996035033071\n");
  auto bad = test::run_process(
      {KVCTL_PATH, "keys", "hash", "--hash-generation", "0.5.6", "--tokens", "1"}, "");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("legacy"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace kvnode
