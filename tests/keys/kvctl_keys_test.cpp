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
  auto r = test::run_process({KVCTL_PATH, "keys", "hash", "--json-lines", "-"}, input);
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
  EXPECT_EQ(first, "[8373755996035033071]");
  EXPECT_NE(second.find("\"error\""), std::string::npos);
  EXPECT_NE(third.find("line 3"), std::string::npos);
  EXPECT_NE(r.err.find("line 2"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kvnode
