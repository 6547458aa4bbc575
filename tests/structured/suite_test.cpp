// The JSON-Schema-Test-Suite (draft 2020-12, shared copy) through the grammar engine.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "structured/json_schema_suite.h"

namespace deepinfer::structured {
namespace {

std::string suite_dir() {
  return std::string(DEEPINFER_SHARED_DIR) + "/data/JSON-Schema-Test-Suite/tests/draft2020-12";
}

TEST(JsonSchemaSuite, Draft202012MainDirectory) {
  if (!std::filesystem::is_directory(suite_dir())) GTEST_SKIP() << "no suite at " << suite_dir();
  std::ostringstream out;
  SuiteSummary summary = run_json_schema_suite(suite_dir(), {}, out);
  EXPECT_EQ(summary.failed, 0u) << out.str();
  EXPECT_GE(summary.groups_supported * 100, summary.groups * 60) << out.str();
  std::string text = out.str();
  std::string last = text.substr(text.rfind('\n', text.size() - 2) + 1);
  EXPECT_EQ(last, std::to_string(summary.passed) + " passed, " + std::to_string(summary.failed) +
                      " failed, " + std::to_string(summary.skipped) + " skipped\n");
}

TEST(JsonSchemaSuite, OptionalFormatDirectoryForSupportedFormats) {
  std::string dir = suite_dir() + "/optional/format";
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << "no suite at " << dir;
  SuiteOptions options;
  options.enforce_format = true;
  std::ostringstream out;
  SuiteSummary summary = run_json_schema_suite(dir, options, out);
  // Exact formats must pass completely; the documented approximations are reported, not asserted.
  for (const auto& failure : summary.failures) {
    for (const char* exact :
         {"date.json", "uuid.json", "ipv4.json", "ipv6.json", "duration.json", "uri.json"}) {
      EXPECT_NE(failure.rfind(exact, 0), 0u) << failure;
    }
  }
  std::cout << out.str();
}

}  // namespace
}  // namespace deepinfer::structured
