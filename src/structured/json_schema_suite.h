// Runs JSON-Schema-Test-Suite files against the grammar engine: every instance, serialized under
// the compact whitespace policy in schema property order, must be accepted as a complete
// document exactly when the suite marks it valid. Groups whose schema uses an unsupported
// feature are skipped, naming the feature.
#pragma once

#include <cstddef>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace deepinfer::structured {

struct SuiteOptions {
  // false: `format` is an annotation (the suite's main directory); true: formats are enforced
  // (the suite's optional/format directory).
  bool enforce_format = false;
  bool verbose = false;
};

struct SuiteSummary {
  size_t passed = 0;
  size_t failed = 0;
  size_t skipped = 0;
  size_t groups = 0;
  size_t groups_supported = 0;
  std::map<std::string, size_t> skipped_groups_by_feature;
  std::vector<std::string> failures;  // "file: group / test"
};

// Runs every *.json file directly inside `directory` (sorted by name), printing per-file results
// to `out` and, last, the line "N passed, M failed, K skipped".
SuiteSummary run_json_schema_suite(const std::string& directory, const SuiteOptions& options,
                                   std::ostream& out);

}  // namespace deepinfer::structured
