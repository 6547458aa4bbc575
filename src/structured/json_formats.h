// Regular expressions (full match) for the string formats the JSON schema compiler enforces.
#pragma once

#include <string>

namespace deepinfer::structured {

// nullptr for formats that are not supported.
const char* format_regex(const std::string& format);

}  // namespace deepinfer::structured
