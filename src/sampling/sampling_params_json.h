// SamplingParams from an already parsed JSON value (the server's request body holds the
// sampling fields next to others). Kept out of the public header so that it does not pull
// nlohmann/json into every user of the API.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "deepinfer/sampling_params.h"

namespace deepinfer {

// Same contract as sampling_params_from_json(std::string_view): unknown keys, wrong types
// and invalid values throw Error naming the key; the result is validated.
SamplingParams sampling_params_from_json_value(const nlohmann::json& object);

}  // namespace deepinfer
