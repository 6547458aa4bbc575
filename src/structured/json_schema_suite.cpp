#include "structured/json_schema_suite.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "structured/automaton.h"
#include "structured/json_schema.h"
#include "structured/stack_pool.h"

namespace deepinfer::structured {
namespace {

struct GroupOutcome {
  bool supported = true;
  std::string skip_feature;
};

bool matches_document(const Automaton& automaton, const std::string& text) {
  if (automaton.empty_language) return false;
  StackPool pool(automaton, default_limits(), false);
  int32_t set = pool.step_bytes(pool.initial_set(),
                                {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  return set != kDeadSet && (pool.flags(set) & kCanFinish);
}

}  // namespace

SuiteSummary run_json_schema_suite(const std::string& directory, const SuiteOptions& options,
                                   std::ostream& out) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(directory))
    DI_THROW("JSON-Schema-Test-Suite directory '", directory, "' does not exist");
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(directory)) {
    if (entry.is_regular_file() && entry.path().extension() == ".json")
      files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) DI_THROW("no *.json test files in '", directory, "'");
  out << (options.enforce_format
              ? "format: enforced (assertion), as in the suite's optional/format tests\n"
              : "format: annotation only (not enforced); run optional/format with "
                "--enforce-format to test format enforcement\n");
  SuiteSummary summary;
  JsonSchemaOptions schema_options;
  schema_options.enforce_format = options.enforce_format;
  for (const auto& path : files) {
    std::ifstream stream(path);
    Json groups;
    try {
      groups = Json::parse(stream);
    } catch (const Json::parse_error& e) {
      DI_THROW("test file '", path.string(), "' is not valid JSON: ", e.what());
    }
    size_t passed = 0, failed = 0, skipped = 0;
    std::vector<std::string> notes;
    for (const auto& group : groups) {
      const std::string description = group.value("description", "");
      const Json& schema = group.at("schema");
      const Json& tests = group.at("tests");
      ++summary.groups;
      std::optional<Automaton> automaton;
      std::string error;
      try {
        automaton =
            build_automaton(json_schema_to_grammar(schema, schema_options), default_limits());
      } catch (const UnsupportedSchemaError& e) {
        ++summary.skipped_groups_by_feature[e.feature()];
        skipped += tests.size();
        notes.push_back("  skipped [" + e.feature() + "] " + description);
        if (options.verbose) notes.push_back(std::string("    ") + e.what());
        continue;
      } catch (const Error& e) {
        error = e.what();
      }
      ++summary.groups_supported;
      for (const auto& test : tests) {
        bool expected = test.at("valid").get<bool>();
        bool accepted = false;
        std::string text;
        if (automaton) {
          text = serialize_json(test.at("data"), schema_key_rank(schema));
          accepted = matches_document(*automaton, text);
        }
        if (automaton && accepted == expected) {
          ++passed;
          continue;
        }
        ++failed;
        std::string what =
            path.filename().string() + ": " + description + " / " + test.value("description", "");
        summary.failures.push_back(what);
        notes.push_back("  FAILED " + description + " / " + test.value("description", "") +
                        (automaton ? std::string(" (expected ") + (expected ? "valid" : "invalid") +
                                         ", document " + text + ")"
                                   : " (compile error: " + error + ")"));
      }
    }
    out << path.filename().string() << ": " << passed << " passed, " << failed << " failed, "
        << skipped << " skipped\n";
    for (const auto& note : notes) out << note << '\n';
    summary.passed += passed;
    summary.failed += failed;
    summary.skipped += skipped;
  }
  out << "groups supported: " << summary.groups_supported << " of " << summary.groups << " ("
      << (summary.groups ? 100 * summary.groups_supported / summary.groups : 0) << "%)\n";
  out << "skipped groups by feature:";
  for (const auto& [feature, count] : summary.skipped_groups_by_feature)
    out << ' ' << feature << '=' << count;
  out << '\n';
  out << summary.passed << " passed, " << summary.failed << " failed, " << summary.skipped
      << " skipped\n";
  return summary;
}

}  // namespace deepinfer::structured
