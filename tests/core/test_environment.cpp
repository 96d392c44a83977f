// The environment registry (core/environment.hpp): docs/ENVIRONMENT.md lists its table row for
// row under its groups, and nothing in src/ reads the environment except through it (the
// CLI's own reads name variables of the table).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "core/environment.hpp"

namespace ringattn {
namespace {

namespace fs = std::filesystem;

const fs::path kSource = RINGATTN_SOURCE_DIR;

// "## group" and "| `NAME` | values | meaning |", as the page holds them.
std::vector<std::string> table_as_markdown() {
  std::vector<std::string> lines;
  std::string group;
  for (const EnvironmentVariable& v : kEnvironment) {
    if (v.group != group) lines.push_back("## " + (group = v.group));
    lines.push_back(std::string("| `") + v.name + "` | " + v.values + " | " + v.meaning + " |");
  }
  return lines;
}

// The page's table rows, each section's heading before its first (sections without a table
// are prose: the scripts' own variables).
std::vector<std::string> page_headings_and_rows(const fs::path& page) {
  std::ifstream in(page);
  std::vector<std::string> lines;
  std::string heading;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("## ")) {
      heading = line;
    } else if (line.starts_with("| `")) {
      if (!heading.empty()) lines.push_back(heading);
      heading.clear();
      lines.push_back(line);
    }
  }
  return lines;
}

TEST(Environment, DocListsTheTableRowForRow) {
  if (!fs::exists(kSource / "src")) GTEST_SKIP() << "SKIPPED: no source tree at " << kSource;
  const fs::path page = kSource / "docs" / "ENVIRONMENT.md";
  ASSERT_TRUE(fs::exists(page)) << page;
  const std::vector<std::string> want = table_as_markdown(), got = page_headings_and_rows(page);
  if (got == want) return;
  std::size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::string all;
  for (const std::string& line : want) all += line + "\n";
  ADD_FAILURE() << "docs/ENVIRONMENT.md differs from core/environment.hpp's table at its heading "
                   "or row "
                << i + 1 << ":\n  page:  " << (i < got.size() ? got[i] : "(nothing)")
                << "\n  table: " << (i < want.size() ? want[i] : "(nothing)")
                << "\nIts headings and rows should read, in this order (a heading may be "
                   "followed by prose and the table's header):\n"
                << all;
}

TEST(Environment, NamesAreUniqueAndGroupsContiguous) {
  std::set<std::string> names, groups_done;
  std::string group;
  for (const EnvironmentVariable& v : kEnvironment) {
    EXPECT_TRUE(names.insert(v.name).second) << v.name << " is listed twice";
    EXPECT_NE(std::string(v.values), "") << v.name;
    EXPECT_NE(std::string(v.meaning), "") << v.name;
    // A markdown cell ends at a bare '|'.
    EXPECT_EQ(std::string(v.values).find('|'), std::string::npos) << v.name;
    EXPECT_EQ(std::string(v.meaning).find('|'), std::string::npos) << v.name;
    if (v.group != group) {
      EXPECT_TRUE(groups_done.insert(v.group).second) << v.group << " is split by another group";
      group = v.group;
    }
  }
  EXPECT_STREQ(environment_name(Env::cpu_kernels), "RINGATTN_CPU_KERNELS");
  EXPECT_STREQ(environment_name(Env::mv2_comm_world_size), "MV2_COMM_WORLD_SIZE");
}

// Only environment.hpp calls getenv; the CLI, which cannot include it, may read variables of
// the table by their literal names.
TEST(Environment, EveryReadGoesThroughTheTable) {
  if (!fs::exists(kSource / "src")) GTEST_SKIP() << "SKIPPED: no source tree at " << kSource;
  std::set<std::string> names;
  for (const EnvironmentVariable& v : kEnvironment) names.insert(v.name);
  const std::regex call(R"re(getenv\s*\()re");
  const std::regex literal(R"re(getenv\s*\(\s*"([A-Za-z0-9_]+)"\s*\))re");
  const std::set<std::string> extensions = {".cpp", ".hpp", ".cu", ".cuh", ".h", ".inc", ".ipp"};
  std::vector<std::string> bad;
  int cli_reads = 0;
  for (const fs::path& root : {kSource / "src", kSource / "python" / "src"}) {
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      if (!e.is_regular_file() || !extensions.contains(e.path().extension().string())) continue;
      const fs::path rel = fs::relative(e.path(), kSource);
      if (rel == fs::path("src/core/environment.hpp")) continue;
      const bool cli = rel.string().starts_with("src/cli/");
      std::ifstream in(e.path());
      int n = 0;
      for (std::string line; std::getline(in, line);) {
        ++n;
        const std::string code = line.substr(0, line.find("//"));
        if (!std::regex_search(code, call)) continue;
        const std::string where = rel.string() + ":" + std::to_string(n) + ": " + line;
        std::smatch m;
        if (!cli)
          bad.push_back(where + " (read through environment_value)");
        else if (!std::regex_search(code, m, literal) || !names.contains(m[1].str()))
          bad.push_back(where + " (not a variable of core/environment.hpp's table)");
        else
          ++cli_reads;
      }
    }
  }
  EXPECT_TRUE(bad.empty()) << ::testing::PrintToString(bad);
  EXPECT_GT(cli_reads, 0) << "the scan found none of the CLI's reads: is it reading src/cli?";
}

}  // namespace
}  // namespace ringattn
