// Subcommands of the structured layer.
#include <iostream>

#include "commands.h"
#include "core/error.h"
#include "structured/json_schema_suite.h"

namespace deepinfer::cli {

void register_structured_commands(CLI::App& app) {
  auto* suite = app.add_subcommand("json-schema-suite",
                                   "Run a JSON-Schema-Test-Suite draft directory against the "
                                   "grammar engine (exit 1 on failures)");
  static std::string directory;
  static structured::SuiteOptions options;
  suite->add_option("DIR", directory, "e.g. JSON-Schema-Test-Suite/tests/draft2020-12")->required();
  suite->add_flag("--enforce-format", options.enforce_format,
                  "enforce `format` (for the suite's optional/format directory); default when DIR "
                  "ends in 'format'");
  suite->add_flag("--verbose", options.verbose, "print why each skipped group is unsupported");
  suite->callback([] {
    std::string trimmed = directory;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    if (trimmed.size() >= 6 && trimmed.compare(trimmed.size() - 6, 6, "format") == 0)
      options.enforce_format = true;
    auto summary = structured::run_json_schema_suite(directory, options, std::cout);
    if (summary.failed > 0) DI_THROW(summary.failed, " test cases failed (listed above)");
  });
}

}  // namespace deepinfer::cli
