// Regular expressions in the syntax JSON schema `pattern` uses (ECMAScript): literals, classes
// ([...], \d \w \s and negations, \p{General_Category}), `.`, groups ((...), (?:...), (?<n>...)),
// alternation, quantifiers (* + ? {n} {n,} {n,m}, lazy forms accepted), escapes (\n \t \xHH
// \uHHHH \u{H...} \cX), anchors ^ $ at the edges of top-level alternatives. Lookaround,
// backreferences and word boundaries are rejected with an error naming the position.
#pragma once

#include <string_view>

#include "structured/grammar.h"
#include "structured/limits.h"
#include "structured/utf8_ranges.h"

namespace deepinfer::structured {

enum class RegexMode {
  kFullMatch,  // the whole text must match (structured-output regex constraints)
  kSearch,     // a match anywhere, unless anchored (JSON schema `pattern`)
};

// Throws Error("regex ... at position N: reason") for bad or unsupported syntax.
ExprPtr regex_to_expr(std::string_view pattern, RegexMode mode, TextEncoding encoding,
                      const GrammarLimits& limits = default_limits());

}  // namespace deepinfer::structured
