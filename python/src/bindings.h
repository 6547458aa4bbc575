// Pieces of the deepinfer._deepinfer extension (one function per part of the C++ API) and the
// Python <-> JSON conversions they share.
#pragma once

#include <string>

#include <nanobind/nanobind.h>
#include <nlohmann/json.hpp>

namespace deepinfer::python {

namespace nb = nanobind;

void bind_errors(nb::module_& module);
void bind_params(nb::module_& module);
void bind_outputs(nb::module_& module);
void bind_llm(nb::module_& module);

// A Python value (None, bool, int, float, str, list/tuple, dict with str keys) as JSON.
// Floats keep NaN and infinities so that validation, not the conversion, names the problem.
// `path` names the value in the Error thrown for anything else.
nlohmann::json to_json(nb::handle value, const std::string& path);
nb::object from_json(const nlohmann::json& value);

}  // namespace deepinfer::python
