// EBNF in the GBNF dialect of llama.cpp (also accepted by xgrammar):
//
//   root   ::= object                      # rules: name ::= body; the start rule is "root"
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//   pair   ::= string ":" ws value
//   digit  ::= [0-9]                        # classes: [a-z], [^"\\], escapes \n \t \xHH \uHHHH
//   any    ::= .                            # any one UTF-8 character
//   rep    ::= digit{2,4} "x"? "y"* "z"+    # repetition: ? * + {m} {m,} {m,n}
//
// Literals are "..." or '...' with escapes \n \r \t \\ \" \' \xHH \uHHHH \UHHHHHHHH. A rule's
// body may span lines; it ends where the next `name ::=` begins. Rule names use
// [A-Za-z0-9_.-]. Left recursion is rejected (write repetition instead).
#pragma once

#include <string_view>

#include "structured/grammar.h"
#include "structured/limits.h"

namespace deepinfer::structured {

// Throws Error("EBNF line L, column C: reason") on malformed input or undefined rules.
Grammar ebnf_to_grammar(std::string_view text, const GrammarLimits& limits = default_limits(),
                        std::string_view root_rule = "root");

}  // namespace deepinfer::structured
