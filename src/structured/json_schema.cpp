#include "structured/json_schema.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "structured/automaton.h"
#include "structured/byte_dfa.h"
#include "structured/json_formats.h"
#include "structured/number_language.h"
#include "structured/regex.h"
#include "structured/stack_pool.h"
#include "structured/utf8_ranges.h"

namespace deepinfer::structured {
namespace {

constexpr const char* kDefaultBase = "https://deepinfer.invalid/root.json";
constexpr const char* kInternalRef = "deepinfer-node:";

// Instance types as a bit set; "number" is integer | non-integer.
enum TypeBit : uint8_t {
  kNull = 1,
  kBoolean = 2,
  kObject = 4,
  kArray = 8,
  kString = 16,
  kInteger = 32,
  kNonInteger = 64,
  kAllTypes = 127,
};

[[noreturn]] void unsupported(const std::string& feature, const std::string& where,
                              const std::string& detail = "") {
  throw UnsupportedSchemaError(
      feature, concat("JSON schema keyword '", feature, "' at ", where.empty() ? "#" : where,
                      " cannot be enforced by a grammar", detail.empty() ? "" : ": ", detail));
}

bool has_scheme(const std::string& uri) {
  size_t colon = uri.find(':');
  if (colon == std::string::npos || colon == 0) return false;
  for (size_t i = 0; i < colon; ++i) {
    char c = uri[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.'))
      return false;
  }
  return std::isalpha(static_cast<unsigned char>(uri[0]));
}

std::string strip_fragment(const std::string& uri) {
  size_t hash = uri.find('#');
  return hash == std::string::npos ? uri : uri.substr(0, hash);
}

std::string normalize_path(const std::string& uri) {
  // Removes "./" and "x/../" segments after the authority.
  size_t start = uri.find("://");
  start = start == std::string::npos ? 0 : uri.find('/', start + 3);
  if (start == std::string::npos) return uri;
  std::string head = uri.substr(0, start);
  std::string rest = uri.substr(start);
  std::string suffix;
  size_t cut = rest.find_first_of("?#");
  if (cut != std::string::npos) {
    suffix = rest.substr(cut);
    rest = rest.substr(0, cut);
  }
  std::vector<std::string> segments;
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t next = rest.find('/', pos);
    if (next == std::string::npos) next = rest.size();
    std::string seg = rest.substr(pos, next - pos);
    if (seg == "..") {
      if (segments.size() > 1) segments.pop_back();
    } else if (seg != ".") {
      segments.push_back(seg);
    }
    pos = next + 1;
  }
  std::string out = head;
  for (size_t i = 0; i < segments.size(); ++i) out += (i ? "/" : "") + segments[i];
  return out + suffix;
}

std::string resolve_uri(const std::string& base, const std::string& ref) {
  if (ref.empty()) return base;
  if (has_scheme(ref)) return normalize_path(ref);
  std::string doc = strip_fragment(base);
  if (ref[0] == '#') return doc + ref;
  if (ref.rfind("//", 0) == 0) return normalize_path(doc.substr(0, doc.find(':') + 1) + ref);
  if (ref[0] == '/') {
    size_t authority = doc.find("://");
    size_t path = authority == std::string::npos ? std::string::npos : doc.find('/', authority + 3);
    return normalize_path((path == std::string::npos ? doc : doc.substr(0, path)) + ref);
  }
  size_t slash = doc.rfind('/');
  std::string dir =
      slash == std::string::npos ? doc.substr(0, doc.find(':') + 1) : doc.substr(0, slash + 1);
  return normalize_path(dir + ref);
}

std::string percent_decode(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() &&
        std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out += static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

bool json_equal(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) {
    return parse_decimal(number_text(a)).integer == parse_decimal(number_text(b)).integer &&
           parse_decimal(number_text(a)).fraction == parse_decimal(number_text(b)).fraction &&
           parse_decimal(number_text(a)).negative == parse_decimal(number_text(b)).negative;
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!json_equal(a[i], b[i])) return false;
    }
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      auto other = b.find(it.key());
      if (other == b.end() || !json_equal(it.value(), *other)) return false;
    }
    return true;
  }
  return a == b;
}

uint8_t type_of(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return kNull;
    case Json::value_t::boolean:
      return kBoolean;
    case Json::value_t::object:
      return kObject;
    case Json::value_t::array:
      return kArray;
    case Json::value_t::string:
      return kString;
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return kInteger;
    case Json::value_t::number_float:
      return parse_decimal(number_text(value)).fraction.empty() ? kInteger : kNonInteger;
    default:
      return 0;
  }
}

struct SchemaRef {
  const Json* node = nullptr;
  std::string base;
  std::string path;
};

// One subschema's view of object members: its declared properties, patterns and fallback.
struct ObjectPart {
  std::vector<std::pair<std::string, SchemaRef>> properties;
  std::vector<std::pair<std::string, SchemaRef>> patterns;
  std::optional<SchemaRef> additional;  // absent: anything goes
  std::string where;
};

struct ArrayPart {
  std::vector<SchemaRef> prefix;
  std::optional<SchemaRef> items;
};

struct Bound {
  Decimal value;
  bool inclusive;
};

// The conjunction of applicator-free subschemas.
struct FlatSchema {
  uint8_t types = kAllTypes;
  std::optional<std::vector<Json>> enum_values;
  std::vector<Bound> lower, upper;
  std::vector<Decimal> multiple_of;
  uint64_t min_length = 0, max_length = UINT64_MAX;
  std::vector<std::string> patterns, formats;
  std::vector<ObjectPart> object_parts;
  std::vector<std::string> required;
  std::vector<SchemaRef> property_names;
  std::vector<ArrayPart> array_parts;
  uint64_t min_items = 0, max_items = UINT64_MAX;
  uint64_t min_properties = 0, max_properties = UINT64_MAX;
  std::vector<SchemaRef> contains;
  uint64_t min_contains = 1;
  std::string where;

  bool constrains_beyond_type() const {
    return !lower.empty() || !upper.empty() || !multiple_of.empty() || min_length > 0 ||
           max_length != UINT64_MAX || !patterns.empty() || !formats.empty() ||
           !object_parts.empty() || !required.empty() || !property_names.empty() ||
           !array_parts.empty() || min_items > 0 || max_items != UINT64_MAX || min_properties > 0 ||
           max_properties != UINT64_MAX || !contains.empty();
  }
};

using Conjunction = std::vector<SchemaRef>;

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const JsonSchemaOptions& options, const GrammarLimits& limits)
      : root_(root), options_(options), limits_(limits), key_rank_(schema_key_rank(root)) {}

  Grammar compile() {
    std::string base = kDefaultBase;
    index(root_, base, "#");
    uint32_t root_rule = grammar_.add_rule("root");
    ExprPtr value = value_of(SchemaRef{&root_, base_of_[&root_], "#"});
    grammar_.rules[root_rule].body = seq_expr({ws(), value, ws()});
    grammar_.root = root_rule;
    return std::move(grammar_);
  }

  Grammar compile_any() {
    uint32_t root_rule = grammar_.add_rule("root");
    grammar_.rules[root_rule].body = seq_expr({ws(), any_value(), ws()});
    grammar_.root = root_rule;
    return std::move(grammar_);
  }

 private:
  // ---- Resource index ($id, $anchor, JSON pointers) ----
  void index(const Json& node, std::string base, const std::string& path) {
    if (!node.is_object()) {
      path_of_[&node] = path;
      base_of_[&node] = base;
      return;
    }
    auto id = node.find("$id");
    if (id != node.end() && id->is_string() && !node.contains("$ref")) {
      base = resolve_uri(base, id->get<std::string>());
    } else if (id != node.end() && id->is_string()) {
      base = resolve_uri(base, id->get<std::string>());
    }
    if (&node == &root_ || (id != node.end() && id->is_string())) {
      resources_[strip_fragment(base)] = &node;
    }
    for (const char* key : {"$anchor", "$dynamicAnchor"}) {
      auto anchor = node.find(key);
      if (anchor != node.end() && anchor->is_string()) {
        anchors_[strip_fragment(base) + "#" + anchor->get<std::string>()] = &node;
      }
    }
    base_of_[&node] = base;
    path_of_[&node] = path;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string& key = it.key();
      const Json& value = it.value();
      std::string child = path + "/" + key;
      static const std::set<std::string> kSingle = {"additionalProperties",
                                                    "additionalItems",
                                                    "contains",
                                                    "not",
                                                    "if",
                                                    "then",
                                                    "else",
                                                    "propertyNames",
                                                    "unevaluatedItems",
                                                    "unevaluatedProperties",
                                                    "contentSchema",
                                                    "items"};
      static const std::set<std::string> kMap = {
          "properties",  "patternProperties", "$defs",
          "definitions", "dependentSchemas",  "dependencies"};
      static const std::set<std::string> kList = {"allOf", "anyOf", "oneOf", "prefixItems",
                                                  "items"};
      if (kSingle.count(key) && (value.is_object() || value.is_boolean()))
        index(value, base, child);
      if (kMap.count(key) && value.is_object()) {
        for (auto sub = value.begin(); sub != value.end(); ++sub) {
          if (sub.value().is_object() || sub.value().is_boolean())
            index(sub.value(), base, child + "/" + sub.key());
        }
      }
      if (kList.count(key) && value.is_array()) {
        for (size_t i = 0; i < value.size(); ++i)
          index(value[i], base, child + "/" + std::to_string(i));
      }
    }
  }

  SchemaRef ref_to(const Json& node, const std::string& fallback_base,
                   const std::string& fallback_path) {
    auto b = base_of_.find(&node);
    auto p = path_of_.find(&node);
    return SchemaRef{&node, b == base_of_.end() ? fallback_base : b->second,
                     p == path_of_.end() ? fallback_path : p->second};
  }

  SchemaRef child(const SchemaRef& parent, const Json& node, const std::string& suffix) {
    return ref_to(node, parent.base, parent.path + suffix);
  }

  SchemaRef resolve_ref(const SchemaRef& at, const std::string& ref) {
    if (ref.rfind(kInternalRef, 0) == 0)
      return internal_[std::stoul(ref.substr(std::string(kInternalRef).size()))];
    std::string absolute = resolve_uri(at.base, ref);
    std::string doc = strip_fragment(absolute);
    std::string fragment =
        absolute.size() > doc.size() ? percent_decode(absolute.substr(doc.size() + 1)) : "";
    auto resource = resources_.find(doc);
    if (resource == resources_.end()) {
      unsupported(
          "$ref", at.path,
          "reference '" + ref + "' points outside this schema (remote schemas are not fetched)");
    }
    const Json* node = resource->second;
    if (fragment.empty()) return ref_to(*node, doc, at.path + "/$ref");
    if (fragment[0] != '/') {
      auto anchor = anchors_.find(doc + "#" + fragment);
      if (anchor == anchors_.end())
        unsupported("$ref", at.path, "unknown anchor '" + fragment + "'");
      return ref_to(*anchor->second, doc, at.path + "/$ref");
    }
    size_t pos = 1;
    while (pos <= fragment.size()) {
      size_t next = fragment.find('/', pos);
      if (next == std::string::npos) next = fragment.size();
      std::string token = fragment.substr(pos, next - pos);
      for (size_t i; (i = token.find("~1")) != std::string::npos;) token.replace(i, 2, "/");
      for (size_t i; (i = token.find("~0")) != std::string::npos;) token.replace(i, 2, "~");
      if (node->is_object() && node->contains(token)) {
        node = &(*node)[token];
      } else if (node->is_array() && !token.empty() &&
                 token.find_first_not_of("0123456789") == std::string::npos &&
                 std::stoul(token) < node->size()) {
        node = &(*node)[std::stoul(token)];
      } else {
        DI_THROW("JSON schema at ", at.path, ": $ref '", ref, "' does not resolve (no '", token,
                 "')");
      }
      pos = next + 1;
    }
    return ref_to(*node, doc, at.path + "/$ref");
  }

  std::string internal_ref(const SchemaRef& ref) {
    internal_.push_back(ref);
    return kInternalRef + std::to_string(internal_.size() - 1);
  }

  // ---- Shared pieces ----
  ExprPtr ws() const {
    if (!options_.flexible_whitespace) return empty_expr();
    std::bitset<256> set;
    for (char c : std::string(" \t\n\r")) set.set(static_cast<uint8_t>(c));
    return star_expr(byte_set_expr(set));
  }

  ExprPtr shared_rule(const std::string& name, const std::function<ExprPtr()>& body) {
    auto it = shared_rules_.find(name);
    if (it != shared_rules_.end()) return rule_ref_expr(it->second);
    uint32_t id = grammar_.add_rule(name);
    shared_rules_[name] = id;
    grammar_.rules[id].body = body();
    return rule_ref_expr(id);
  }

  ExprPtr any_string() {
    return shared_rule("string", [] {
      return seq_expr({bytes_expr("\""), star_expr(json_string_char_expr()), bytes_expr("\"")});
    });
  }
  ExprPtr any_number() {
    return shared_rule("number", [] {
      return seq_expr(
          {decimal_numeral_expr(),
           optional_expr(seq_expr({byte_set_expr([] {
                                     std::bitset<256> s;
                                     s.set('e');
                                     s.set('E');
                                     return s;
                                   }()),
                                   optional_expr(byte_set_expr([] {
                                     std::bitset<256> s;
                                     s.set('+');
                                     s.set('-');
                                     return s;
                                   }())),
                                   repeat_expr(byte_range_expr('0', '9'), 1, kUnbounded)}))});
    });
  }
  ExprPtr any_integer() {
    return shared_rule("integer", [] { return integer_numeral_expr(); });
  }
  ExprPtr comma() { return seq_expr({ws(), bytes_expr(","), ws()}); }
  ExprPtr colon() { return seq_expr({ws(), bytes_expr(":"), ws()}); }

  ExprPtr any_value() {
    auto it = shared_rules_.find("value");
    if (it != shared_rules_.end()) return rule_ref_expr(it->second);
    uint32_t id = grammar_.add_rule("value");
    shared_rules_["value"] = id;
    ExprPtr value = rule_ref_expr(id);
    ExprPtr member = seq_expr({any_string(), colon(), value});
    ExprPtr object =
        seq_expr({bytes_expr("{"), ws(),
                  optional_expr(seq_expr({member, star_expr(seq_expr({comma(), member}))})), ws(),
                  bytes_expr("}")});
    ExprPtr array =
        seq_expr({bytes_expr("["), ws(),
                  optional_expr(seq_expr({value, star_expr(seq_expr({comma(), value}))})), ws(),
                  bytes_expr("]")});
    uint32_t object_rule = grammar_.add_rule("object", object);
    uint32_t array_rule = grammar_.add_rule("array", array);
    grammar_.rules[id].body =
        alt_expr({rule_ref_expr(object_rule), rule_ref_expr(array_rule), any_string(), any_number(),
                  bytes_expr("true"), bytes_expr("false"), bytes_expr("null")});
    return value;
  }

  // ---- Schema -> expression ----
  static bool is_bare_ref(const Json& node) {
    static const std::set<std::string> kIgnorable = {
        "$ref",    "$schema",  "$comment",   "$defs",    "definitions", "title", "description",
        "default", "examples", "deprecated", "readOnly", "writeOnly",   "$id",   "$anchor"};
    if (!node.contains("$ref") || !node["$ref"].is_string()) return false;
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (!kIgnorable.count(it.key())) return false;
    }
    return true;
  }

  ExprPtr value_of(const SchemaRef& schema) {
    const Json& node = *schema.node;
    if (node.is_boolean()) return node.get<bool>() ? any_value() : nothing_expr();
    if (!node.is_object())
      DI_THROW("JSON schema at ", schema.path, ": a schema must be an object or a boolean");
    // A bare reference shares the target's rule (this is what makes recursion work).
    if (is_bare_ref(node)) {
      return value_of(resolve_ref(schema, node["$ref"].get<std::string>()));
    }
    auto found = rule_of_.find(&node);
    if (found != rule_of_.end()) return rule_ref_expr(found->second);
    uint32_t id = grammar_.add_rule("schema" + std::to_string(grammar_.rules.size()));
    rule_of_[&node] = id;
    if (++depth_ > limits_.max_nesting)
      DI_THROW("JSON schema at ", schema.path, ": nested too deeply");
    std::vector<ExprPtr> alternatives;
    for (const FlatSchema& flat : expand(schema)) alternatives.push_back(compile_flat(flat));
    --depth_;
    grammar_.rules[id].body = alt_expr(std::move(alternatives));
    return rule_ref_expr(id);
  }

  ExprPtr value_of_conjunction(const Conjunction& parts, const std::string& where) {
    if (parts.empty()) return any_value();
    if (parts.size() == 1) return value_of(parts[0]);
    Json all_of = Json::object();
    all_of["allOf"] = Json::array();
    for (const auto& part : parts) all_of["allOf"].push_back(Json{{"$ref", internal_ref(part)}});
    arena_.push_back(std::move(all_of));
    path_of_[&arena_.back()] = where;
    return value_of(SchemaRef{&arena_.back(), kDefaultBase, where});
  }

  // Disjunctive normal form over $ref / allOf / anyOf / oneOf.
  std::vector<Conjunction> dnf(const SchemaRef& schema, uint32_t depth) {
    if (depth > 32)
      unsupported("$ref", schema.path, "allOf/$ref chain too deep or recursive at the top level");
    const Json& node = *schema.node;
    if (node.is_boolean())
      return node.get<bool>() ? std::vector<Conjunction>{{}} : std::vector<Conjunction>{};
    if (!node.is_object())
      DI_THROW("JSON schema at ", schema.path, ": a schema must be an object or a boolean");
    check_supported(schema);
    std::vector<Conjunction> result = {{schema}};
    auto product = [&](const std::vector<Conjunction>& other) {
      std::vector<Conjunction> out;
      for (const auto& a : result) {
        for (const auto& b : other) {
          Conjunction c = a;
          c.insert(c.end(), b.begin(), b.end());
          out.push_back(std::move(c));
        }
      }
      if (out.size() > 256)
        unsupported("anyOf", schema.path, "too many combinations of anyOf/oneOf branches");
      result = std::move(out);
    };
    if (auto ref = node.find("$ref"); ref != node.end()) {
      if (!ref->is_string()) DI_THROW("JSON schema at ", schema.path, ": $ref must be a string");
      product(dnf(resolve_ref(schema, ref->get<std::string>()), depth + 1));
    }
    if (auto all = node.find("allOf"); all != node.end()) {
      if (!all->is_array() || all->empty())
        DI_THROW("JSON schema at ", schema.path, ": allOf must be a non-empty array");
      for (size_t i = 0; i < all->size(); ++i)
        product(dnf(child(schema, (*all)[i], "/allOf/" + std::to_string(i)), depth + 1));
    }
    for (const char* keyword : {"anyOf", "oneOf"}) {
      auto any = node.find(keyword);
      if (any == node.end()) continue;
      if (!any->is_array() || any->empty())
        DI_THROW("JSON schema at ", schema.path, ": ", keyword, " must be a non-empty array");
      std::vector<Conjunction> branches;
      std::vector<std::vector<FlatSchema>> flats;
      for (size_t i = 0; i < any->size(); ++i) {
        auto sub =
            dnf(child(schema, (*any)[i], "/" + std::string(keyword) + "/" + std::to_string(i)),
                depth + 1);
        if (std::string(keyword) == "oneOf") {
          std::vector<FlatSchema> f;
          for (const auto& conj : sub) {
            if (auto flat = merge(conj, schema.path)) f.push_back(*flat);
          }
          flats.push_back(std::move(f));
        }
        branches.insert(branches.end(), sub.begin(), sub.end());
      }
      if (std::string(keyword) == "oneOf") {
        for (size_t i = 0; i < flats.size(); ++i) {
          for (size_t j = i + 1; j < flats.size(); ++j) {
            for (const auto& a : flats[i]) {
              for (const auto& b : flats[j]) {
                if (!disjoint(a, b)) {
                  unsupported("oneOf", schema.path,
                              "branches " + std::to_string(i) + " and " + std::to_string(j) +
                                  " may overlap (exactly-one needs a complement)");
                }
              }
            }
          }
        }
      }
      product(branches);
    }
    return result;
  }

  void check_supported(const SchemaRef& schema) {
    const Json& node = *schema.node;
    static const std::set<std::string> kUnsupported = {
        "dependentRequired", "dependentSchemas", "dependencies", "$dynamicRef", "$recursiveRef"};
    static const std::set<std::string> kApplicators = {
        "$ref",     "allOf",      "anyOf", "oneOf", "not", "if", "dependentSchemas",
        "contains", "$dynamicRef"};
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string& key = it.key();
      if (kUnsupported.count(key)) unsupported(key, schema.path);
      if (key == "if" && (node.contains("then") || node.contains("else")))
        unsupported("if", schema.path);
      if (key == "uniqueItems" && it.value() == true) {
        unsupported("uniqueItems", schema.path, "uniqueness of array items is not expressible");
      }
      if ((key == "unevaluatedProperties" || key == "unevaluatedItems") && it.value() != true &&
          !(it.value().is_object() && it.value().empty())) {
        // Without in-place applicators, "unevaluated" is exactly "not matched by this schema's own
        // properties/patternProperties/prefixItems/items", which merge() handles.
        for (const auto& applicator : kApplicators) {
          if (node.contains(applicator))
            unsupported(key, schema.path, "together with " + applicator);
        }
      }
      if (key == "maxContains" && node.contains("contains"))
        unsupported(key, schema.path, "an upper bound on matching items needs a complement");
      if (key == "$schema" && it.value().is_string()) {
        std::string uri = it.value().get<std::string>();
        if (uri.find("json-schema.org/") == std::string::npos) {
          unsupported("$schema", schema.path,
                      "custom meta-schema '" + uri + "' (vocabularies cannot be checked)");
        }
      }
    }
  }

  std::vector<FlatSchema> expand(const SchemaRef& schema) {
    std::vector<FlatSchema> out;
    for (const auto& conj : dnf(schema, 0)) {
      if (auto flat = merge(conj, schema.path)) out.push_back(std::move(*flat));
    }
    return out;
  }

  static uint8_t parse_types(const Json& type, const std::string& where) {
    auto one = [&](const Json& name) -> uint8_t {
      if (!name.is_string()) DI_THROW("JSON schema at ", where, ": type names must be strings");
      std::string n = name.get<std::string>();
      if (n == "null") return kNull;
      if (n == "boolean") return kBoolean;
      if (n == "object") return kObject;
      if (n == "array") return kArray;
      if (n == "string") return kString;
      if (n == "integer") return kInteger;
      if (n == "number") return kInteger | kNonInteger;
      DI_THROW("JSON schema at ", where, ": unknown type '", n, "'");
    };
    if (type.is_array()) {
      uint8_t bits = 0;
      for (const auto& t : type) bits |= one(t);
      return bits;
    }
    return one(type);
  }

  static uint64_t parse_count(const Json& value, const std::string& where, const char* keyword) {
    if (!value.is_number() || value.get<double>() < 0 ||
        parse_decimal(number_text(value)).fraction.size() != 0) {
      DI_THROW("JSON schema at ", where, ": ", keyword, " must be a non-negative integer");
    }
    double d = value.get<double>();
    return d > 1e18 ? UINT64_MAX - 1 : static_cast<uint64_t>(d);
  }

  // Intersects applicator-free subschemas; nullopt when they contradict on type.
  std::optional<FlatSchema> merge(const Conjunction& conj, const std::string& where) {
    FlatSchema flat;
    flat.where = where;
    for (const SchemaRef& part : conj) {
      const Json& node = *part.node;
      const std::string& at = part.path;
      check_supported(part);
      auto number = [&](const char* keyword) -> std::optional<Decimal> {
        auto it = node.find(keyword);
        if (it == node.end()) return std::nullopt;
        if (!it->is_number()) DI_THROW("JSON schema at ", at, ": ", keyword, " must be a number");
        return parse_decimal(number_text(*it));
      };
      if (auto t = node.find("type"); t != node.end()) flat.types &= parse_types(*t, at);
      if (auto n = node.find("not"); n != node.end()) {
        // Expressible when the negated schema only restricts types: complement the type set.
        uint8_t negated = 0;
        for (const auto& negated_conj : dnf(child(part, *n, "/not"), 1)) {
          auto f = merge(negated_conj, at + "/not");
          if (!f) continue;
          if (f->enum_values || f->constrains_beyond_type()) {
            unsupported("not", at, "only negations of type restrictions are expressible");
          }
          negated |= f->types;
        }
        flat.types &= static_cast<uint8_t>(~negated & kAllTypes);
      }
      if (auto c = node.find("contains"); c != node.end()) {
        flat.contains.push_back(child(part, *c, "/contains"));
        if (auto m = node.find("minContains"); m != node.end())
          flat.min_contains = parse_count(*m, at, "minContains");
      }
      if (auto v = node.find("minProperties"); v != node.end())
        flat.min_properties = std::max(flat.min_properties, parse_count(*v, at, "minProperties"));
      if (auto v = node.find("maxProperties"); v != node.end())
        flat.max_properties = std::min(flat.max_properties, parse_count(*v, at, "maxProperties"));
      std::optional<std::vector<Json>> values;
      if (auto e = node.find("enum"); e != node.end()) {
        if (!e->is_array()) DI_THROW("JSON schema at ", at, ": enum must be an array");
        values = std::vector<Json>(e->begin(), e->end());
      }
      if (auto c = node.find("const"); c != node.end()) {
        std::vector<Json> single = {*c};
        if (values) {
          std::vector<Json> both;
          for (const auto& v : *values) {
            if (json_equal(v, *c)) both.push_back(v);
          }
          values = both;
        } else {
          values = single;
        }
      }
      if (values) {
        if (flat.enum_values) {
          std::vector<Json> both;
          for (const auto& v : *flat.enum_values) {
            for (const auto& w : *values) {
              if (json_equal(v, w)) {
                both.push_back(v);
                break;
              }
            }
          }
          flat.enum_values = both;
        } else {
          flat.enum_values = values;
        }
      }
      // Numbers. exclusiveMinimum as a boolean is draft-4 syntax modifying minimum.
      bool draft4_excl_min = node.contains("exclusiveMinimum") &&
                             node["exclusiveMinimum"].is_boolean() &&
                             node["exclusiveMinimum"].get<bool>();
      bool draft4_excl_max = node.contains("exclusiveMaximum") &&
                             node["exclusiveMaximum"].is_boolean() &&
                             node["exclusiveMaximum"].get<bool>();
      if (auto v = number("minimum")) flat.lower.push_back({*v, !draft4_excl_min});
      if (auto v = number("maximum")) flat.upper.push_back({*v, !draft4_excl_max});
      if (node.contains("exclusiveMinimum") && node["exclusiveMinimum"].is_number()) {
        flat.lower.push_back({*number("exclusiveMinimum"), false});
      }
      if (node.contains("exclusiveMaximum") && node["exclusiveMaximum"].is_number()) {
        flat.upper.push_back({*number("exclusiveMaximum"), false});
      }
      if (auto v = number("multipleOf")) {
        if (v->negative || v->is_zero())
          DI_THROW("JSON schema at ", at, ": multipleOf must be > 0");
        flat.multiple_of.push_back(*v);
      }
      // Strings.
      if (auto v = node.find("minLength"); v != node.end())
        flat.min_length = std::max(flat.min_length, parse_count(*v, at, "minLength"));
      if (auto v = node.find("maxLength"); v != node.end())
        flat.max_length = std::min(flat.max_length, parse_count(*v, at, "maxLength"));
      if (auto v = node.find("pattern"); v != node.end()) {
        if (!v->is_string()) DI_THROW("JSON schema at ", at, ": pattern must be a string");
        flat.patterns.push_back(v->get<std::string>());
      }
      if (auto v = node.find("format"); v != node.end() && options_.enforce_format) {
        if (!v->is_string()) DI_THROW("JSON schema at ", at, ": format must be a string");
        flat.formats.push_back(v->get<std::string>());
      }
      // Objects.
      const Json* unevaluated_properties = nullptr;
      if (auto u = node.find("unevaluatedProperties");
          u != node.end() && *u != true && !(u->is_object() && u->empty())) {
        unevaluated_properties = &*u;
      }
      bool has_object_keywords = node.contains("properties") ||
                                 node.contains("patternProperties") ||
                                 node.contains("additionalProperties") || unevaluated_properties ||
                                 (options_.strict_properties && (flat.types & kObject));
      if (has_object_keywords) {
        ObjectPart object;
        object.where = at;
        if (auto p = node.find("properties"); p != node.end()) {
          if (!p->is_object()) DI_THROW("JSON schema at ", at, ": properties must be an object");
          for (auto it = p->begin(); it != p->end(); ++it) {
            object.properties.emplace_back(it.key(),
                                           child(part, it.value(), "/properties/" + it.key()));
          }
        }
        if (auto p = node.find("patternProperties"); p != node.end()) {
          if (!p->is_object())
            DI_THROW("JSON schema at ", at, ": patternProperties must be an object");
          for (auto it = p->begin(); it != p->end(); ++it) {
            object.patterns.emplace_back(it.key(),
                                         child(part, it.value(), "/patternProperties/" + it.key()));
          }
        }
        if (auto p = node.find("additionalProperties"); p != node.end()) {
          if (!(p->is_object() && p->empty()) && *p != true)
            object.additional = child(part, *p, "/additionalProperties");
        } else if (unevaluated_properties) {
          object.additional = child(part, *unevaluated_properties, "/unevaluatedProperties");
        } else if (options_.strict_properties) {
          static const Json kFalse = false;
          object.additional = SchemaRef{&kFalse, kDefaultBase, at + "/additionalProperties"};
        }
        flat.object_parts.push_back(std::move(object));
      }
      if (auto r = node.find("required"); r != node.end()) {
        if (!r->is_array()) DI_THROW("JSON schema at ", at, ": required must be an array");
        for (const auto& name : *r) {
          if (!name.is_string())
            DI_THROW("JSON schema at ", at, ": required entries must be strings");
          if (std::find(flat.required.begin(), flat.required.end(), name.get<std::string>()) ==
              flat.required.end()) {
            flat.required.push_back(name.get<std::string>());
          }
        }
      }
      if (auto p = node.find("propertyNames"); p != node.end())
        flat.property_names.push_back(child(part, *p, "/propertyNames"));
      // Arrays. An array-valued "items" is the pre-2020 spelling of prefixItems.
      ArrayPart array;
      bool has_array_keywords = false;
      if (auto p = node.find("prefixItems"); p != node.end()) {
        if (!p->is_array()) DI_THROW("JSON schema at ", at, ": prefixItems must be an array");
        for (size_t i = 0; i < p->size(); ++i)
          array.prefix.push_back(child(part, (*p)[i], "/prefixItems/" + std::to_string(i)));
        has_array_keywords = true;
      }
      if (auto p = node.find("items"); p != node.end()) {
        if (p->is_array()) {
          for (size_t i = 0; i < p->size(); ++i)
            array.prefix.push_back(child(part, (*p)[i], "/items/" + std::to_string(i)));
          if (auto extra = node.find("additionalItems"); extra != node.end()) {
            array.items = child(part, *extra, "/additionalItems");
          }
        } else {
          array.items = child(part, *p, "/items");
        }
        has_array_keywords = true;
      }
      if (auto u = node.find("unevaluatedItems");
          u != node.end() && *u != true && !(u->is_object() && u->empty())) {
        if (!array.items) array.items = child(part, *u, "/unevaluatedItems");
        has_array_keywords = true;
      }
      if (has_array_keywords) flat.array_parts.push_back(std::move(array));
      if (auto v = node.find("minItems"); v != node.end())
        flat.min_items = std::max(flat.min_items, parse_count(*v, at, "minItems"));
      if (auto v = node.find("maxItems"); v != node.end())
        flat.max_items = std::min(flat.max_items, parse_count(*v, at, "maxItems"));
    }
    if (flat.types == 0) return std::nullopt;
    if (flat.enum_values) {
      std::vector<Json> kept;
      for (const auto& v : *flat.enum_values) {
        if (type_of(v) & flat.types) kept.push_back(v);
      }
      flat.enum_values = kept;
      if (kept.empty()) return std::nullopt;
    }
    return flat;
  }

  // Conservative: true only when no instance can satisfy both.
  bool disjoint(const FlatSchema& a, const FlatSchema& b) {
    uint8_t types = a.types & b.types;
    if (a.enum_values) {
      uint8_t t = 0;
      for (const auto& v : *a.enum_values) t |= type_of(v);
      types &= t;
    }
    if (b.enum_values) {
      uint8_t t = 0;
      for (const auto& v : *b.enum_values) t |= type_of(v);
      types &= t;
    }
    if (types == 0) return true;
    if (a.enum_values && b.enum_values) {
      for (const auto& x : *a.enum_values) {
        for (const auto& y : *b.enum_values) {
          if (json_equal(x, y)) return false;
        }
      }
      return true;
    }
    if (types == kObject) {
      // One requires a property the other forbids.
      auto forbids = [](const FlatSchema& s, const std::string& name) {
        for (const auto& part : s.object_parts) {
          bool declared = false;
          for (const auto& [n, sub] : part.properties) {
            if (n == name) {
              declared = true;
              if (sub.node->is_boolean() && !sub.node->get<bool>()) return true;
            }
          }
          if (!declared && part.patterns.empty() && part.additional &&
              part.additional->node->is_boolean() && !part.additional->node->get<bool>()) {
            return true;
          }
        }
        return false;
      };
      for (const auto& name : a.required) {
        if (forbids(b, name)) return true;
      }
      for (const auto& name : b.required) {
        if (forbids(a, name)) return true;
      }
    }
    return false;
  }

  // ---- Flat schema -> expression ----
  ExprPtr compile_flat(const FlatSchema& flat) {
    if (flat.enum_values) return compile_enum(flat);
    std::vector<ExprPtr> alts;
    if (flat.types & kNull) alts.push_back(bytes_expr("null"));
    if (flat.types & kBoolean) alts.push_back(alt_expr({bytes_expr("true"), bytes_expr("false")}));
    if (flat.types & (kInteger | kNonInteger)) alts.push_back(compile_number(flat));
    if (flat.types & kString) alts.push_back(compile_string(flat));
    if (flat.types & kArray) alts.push_back(compile_array(flat));
    if (flat.types & kObject) alts.push_back(compile_object(flat));
    return alt_expr(std::move(alts));
  }

  ExprPtr literal_expr(const Json& value) {
    switch (value.type()) {
      case Json::value_t::number_integer:
      case Json::value_t::number_unsigned:
      case Json::value_t::number_float:
        return decimal_equal_expr(parse_decimal(number_text(value)));
      case Json::value_t::array: {
        std::vector<ExprPtr> parts = {bytes_expr("["), ws()};
        for (size_t i = 0; i < value.size(); ++i) {
          if (i) parts.push_back(comma());
          parts.push_back(literal_expr(value[i]));
        }
        parts.push_back(ws());
        parts.push_back(bytes_expr("]"));
        return seq_expr(std::move(parts));
      }
      case Json::value_t::object: {
        std::vector<std::pair<std::string, const Json*>> items;
        for (auto it = value.begin(); it != value.end(); ++it)
          items.emplace_back(it.key(), &it.value());
        std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
          return key_rank_(a.first) < key_rank_(b.first);
        });
        std::vector<ExprPtr> parts = {bytes_expr("{"), ws()};
        bool first = true;
        for (const auto& [key, item] : items) {
          if (!first) parts.push_back(comma());
          first = false;
          parts.push_back(bytes_expr(serialize_json_string(key)));
          parts.push_back(colon());
          parts.push_back(literal_expr(*item));
        }
        parts.push_back(ws());
        parts.push_back(bytes_expr("}"));
        return seq_expr(std::move(parts));
      }
      default:
        return bytes_expr(serialize_json(value));
    }
  }

  ExprPtr compile_enum(const FlatSchema& flat) {
    FlatSchema rest = flat;
    rest.enum_values.reset();
    bool check = rest.constrains_beyond_type();
    std::vector<ExprPtr> alts;
    for (const auto& value : *flat.enum_values) {
      if (!(type_of(value) & flat.types)) continue;
      if (check && !accepts(rest, value)) continue;
      alts.push_back(literal_expr(value));
    }
    return alt_expr(std::move(alts));
  }

  // Whether `value` satisfies `flat`, decided by the grammar compiled from it.
  bool accepts(const FlatSchema& flat, const Json& value) {
    ExprPtr body = compile_flat(flat);
    Grammar probe = grammar_;
    probe.root = probe.add_rule("enum_probe", body);
    Automaton automaton = build_automaton(probe, limits_);
    if (automaton.empty_language) return false;
    StackPool pool(automaton, limits_, false);
    std::string text = serialize_json(value, key_rank_);
    int32_t set = pool.step_bytes(pool.initial_set(),
                                  {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
    return set != kDeadSet && (pool.flags(set) & kCanFinish);
  }

  ExprPtr compile_number(const FlatSchema& flat) {
    bool integer_only = !(flat.types & kNonInteger);
    bool fraction_only = !(flat.types & kInteger);  // e.g. {"not": {"type": "integer"}}
    if (flat.lower.empty() && flat.upper.empty() && flat.multiple_of.empty() && !fraction_only) {
      return integer_only ? any_integer() : any_number();
    }
    ExprPtr digit = byte_range_expr('0', '9');
    ExprPtr non_integer = seq_expr(
        {optional_expr(bytes_expr("-")),
         alt_expr({bytes_expr("0"), seq_expr({byte_range_expr('1', '9'), star_expr(digit)})}),
         bytes_expr("."), star_expr(digit), byte_range_expr('1', '9'), star_expr(digit)});
    ByteDfa dfa = dfa_from_expr(integer_only    ? *integer_numeral_expr()
                                : fraction_only ? *non_integer
                                                : *decimal_numeral_expr(),
                                limits_);
    auto intersect = [&](const ByteDfa& other) { dfa = dfa_intersect(dfa, other, limits_); };
    try {
      for (const auto& b : flat.lower)
        intersect(dfa_from_expr(*decimal_at_least_expr(b.value, b.inclusive), limits_));
      for (const auto& b : flat.upper)
        intersect(dfa_from_expr(*decimal_at_most_expr(b.value, b.inclusive), limits_));
      for (const auto& m : flat.multiple_of) intersect(decimal_multiple_of_dfa(m, limits_));
    } catch (const UnsupportedSchemaError&) {
      throw;
    } catch (const Error& e) {
      unsupported("multipleOf", flat.where, e.what());
    }
    if (dfa.is_empty()) return nothing_expr();
    return dfa_expr(std::make_shared<ByteDfa>(std::move(dfa)));
  }

  // The language of string *content* (between the quotes) for string constraints.
  std::optional<ByteDfa> string_content_dfa(const FlatSchema& flat) {
    if (flat.patterns.empty() && flat.formats.empty()) return std::nullopt;
    std::optional<ByteDfa> dfa;
    auto intersect = [&](ByteDfa other) {
      dfa = dfa ? dfa_intersect(*dfa, other, limits_) : std::move(other);
    };
    for (const auto& pattern : flat.patterns) {
      try {
        intersect(dfa_from_expr(
            *regex_to_expr(pattern, RegexMode::kSearch, TextEncoding::kJsonString, limits_),
            limits_));
      } catch (const UnsupportedSchemaError&) {
        throw;
      } catch (const Error& e) {
        unsupported("pattern", flat.where, e.what());
      }
    }
    for (const auto& format : flat.formats) {
      const char* regex = format_regex(format);
      if (!regex) unsupported("format", flat.where, "format '" + format + "' is not supported");
      intersect(dfa_from_expr(
          *regex_to_expr(regex, RegexMode::kFullMatch, TextEncoding::kJsonString, limits_),
          limits_));
    }
    if (flat.min_length > 0 || flat.max_length != UINT64_MAX) {
      intersect(dfa_from_expr(*length_expr(flat), limits_));
    }
    return dfa;
  }

  ExprPtr length_expr(const FlatSchema& flat) {
    if (flat.min_length > limits_.max_repeat ||
        (flat.max_length != UINT64_MAX && flat.max_length > limits_.max_repeat)) {
      unsupported("maxLength", flat.where,
                  "string length bounds above " + std::to_string(limits_.max_repeat));
    }
    uint32_t max =
        flat.max_length == UINT64_MAX ? kUnbounded : static_cast<uint32_t>(flat.max_length);
    return repeat_expr(json_string_char_expr(), static_cast<uint32_t>(flat.min_length), max);
  }

  ExprPtr compile_string(const FlatSchema& flat) {
    auto dfa = string_content_dfa(flat);
    if (!dfa) {
      if (flat.min_length == 0 && flat.max_length == UINT64_MAX) return any_string();
      return seq_expr({bytes_expr("\""), length_expr(flat), bytes_expr("\"")});
    }
    if (dfa->is_empty()) return nothing_expr();
    return seq_expr(
        {bytes_expr("\""), dfa_expr(std::make_shared<ByteDfa>(std::move(*dfa))), bytes_expr("\"")});
  }

  ExprPtr compile_array(const FlatSchema& flat) {
    size_t prefix_length = 0;
    for (const auto& part : flat.array_parts)
      prefix_length = std::max(prefix_length, part.prefix.size());
    std::vector<Conjunction> element(prefix_length);
    Conjunction rest;
    for (const auto& part : flat.array_parts) {
      for (size_t j = 0; j < prefix_length; ++j) {
        if (j < part.prefix.size()) {
          element[j].push_back(part.prefix[j]);
        } else if (part.items) {
          element[j].push_back(*part.items);
        }
      }
      if (part.items) rest.push_back(*part.items);
    }
    uint64_t min = flat.min_items, max = flat.max_items;
    if (max != UINT64_MAX && max > limits_.max_repeat)
      max = UINT64_MAX;  // treat huge bounds as unbounded
    if (min > limits_.max_repeat)
      unsupported("minItems", flat.where,
                  "more than " + std::to_string(limits_.max_repeat) + " items");
    ExprPtr rest_value = value_of_conjunction(rest, flat.where + "/items");
    if (!flat.contains.empty() && flat.min_contains > 0) {
      // At least k items match `contains`: R* C (R* C){k-1} R* with commas.
      if (flat.contains.size() > 1 || prefix_length > 0 || max != UINT64_MAX ||
          min > flat.min_contains || flat.min_contains > limits_.max_repeat) {
        unsupported("contains", flat.where,
                    "combined with prefixItems, maxItems, a larger minItems or another contains");
      }
      Conjunction matching = rest;
      matching.push_back(flat.contains[0]);
      ExprPtr hit = value_of_conjunction(matching, flat.where + "/contains");
      auto k = static_cast<uint32_t>(flat.min_contains);
      ExprPtr elements = seq_expr(
          {star_expr(seq_expr({rest_value, comma()})), hit,
           repeat_expr(seq_expr({star_expr(seq_expr({comma(), rest_value})), comma(), hit}), k - 1,
                       k - 1),
           star_expr(seq_expr({comma(), rest_value}))});
      return seq_expr({bytes_expr("["), ws(), elements, ws(), bytes_expr("]")});
    }
    // Elements from index j on, each preceded by a comma.
    std::function<ExprPtr(uint64_t)> tail = [&](uint64_t j) -> ExprPtr {
      if (max != UINT64_MAX && j >= max) return empty_expr();
      if (j >= prefix_length) {
        uint64_t lo = min > j ? min - j : 0;
        uint32_t hi = max == UINT64_MAX ? kUnbounded : static_cast<uint32_t>(max - j);
        return repeat_expr(seq_expr({comma(), rest_value}), static_cast<uint32_t>(lo), hi);
      }
      ExprPtr item = seq_expr(
          {comma(), value_of_conjunction(element[j], flat.where + "/prefixItems"), tail(j + 1)});
      return j >= min ? optional_expr(item) : item;
    };
    ExprPtr elements;
    if (max == 0) {
      elements = empty_expr();
    } else {
      ExprPtr first_value = prefix_length > 0
                                ? value_of_conjunction(element[0], flat.where + "/prefixItems")
                                : rest_value;
      ExprPtr first = seq_expr({first_value, tail(1)});
      elements = min == 0 ? optional_expr(first) : first;
    }
    return seq_expr({bytes_expr("["), ws(), elements, ws(), bytes_expr("]")});
  }

  ExprPtr compile_object(const FlatSchema& flat);

  // String content in canonical escaping: the key space that exclusions are computed in.
  static const ByteDfa& canonical_content_dfa() {
    static const ByteDfa kDfa = dfa_from_expr(
        *star_expr(code_point_set_expr(CodePointSet::all(), TextEncoding::kJsonString)),
        default_limits());
    return kDfa;
  }

  const Json& root_;
  JsonSchemaOptions options_;
  const GrammarLimits& limits_;
  KeyRank key_rank_;
  Grammar grammar_;
  std::deque<Json> arena_;
  std::vector<SchemaRef> internal_;
  std::map<std::string, const Json*> resources_;
  std::map<std::string, const Json*> anchors_;
  std::unordered_map<const Json*, std::string> base_of_;
  std::unordered_map<const Json*, std::string> path_of_;
  std::unordered_map<const Json*, uint32_t> rule_of_;
  std::map<std::string, uint32_t> shared_rules_;
  uint32_t depth_ = 0;
};

ExprPtr SchemaCompiler::compile_object(const FlatSchema& flat) {
  // Declared names in order of first appearance across the conjunction.
  std::vector<std::string> names;
  for (const auto& part : flat.object_parts) {
    for (const auto& [name, sub] : part.properties) {
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  for (const auto& name : flat.required) {
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  std::map<std::string, ByteDfa> pattern_dfas;
  auto pattern_dfa = [&](const std::string& pattern, const std::string& where) -> const ByteDfa& {
    auto it = pattern_dfas.find(pattern);
    if (it != pattern_dfas.end()) return it->second;
    try {
      ByteDfa dfa = dfa_from_expr(
          *regex_to_expr(pattern, RegexMode::kSearch, TextEncoding::kJsonString, limits_), limits_);
      return pattern_dfas.emplace(pattern, std::move(dfa)).first->second;
    } catch (const UnsupportedSchemaError&) {
      throw;
    } catch (const Error& e) {
      unsupported("patternProperties", where, e.what());
    }
  };
  auto content = [](const std::string& name) {
    std::string quoted = serialize_json_string(name);
    return quoted.substr(1, quoted.size() - 2);
  };

  // propertyNames: the key language every key must belong to.
  std::optional<ByteDfa> names_dfa;
  if (!flat.property_names.empty()) {
    SchemaRef names_schema = flat.property_names[0];
    std::vector<FlatSchema> alternatives;
    for (const auto& conj : [&] {
           std::vector<Conjunction> all = {{}};
           for (const auto& ref : flat.property_names) {
             std::vector<Conjunction> next;
             for (const auto& a : all) {
               for (const auto& b : dnf(ref, 0)) {
                 Conjunction c = a;
                 c.insert(c.end(), b.begin(), b.end());
                 next.push_back(std::move(c));
               }
             }
             all = std::move(next);
           }
           return all;
         }()) {
      if (auto f = merge(conj, flat.where + "/propertyNames")) alternatives.push_back(*f);
    }
    ByteDfa any_content = canonical_content_dfa();
    std::optional<ByteDfa> united;
    for (const auto& alt : alternatives) {
      if (!(alt.types & kString)) continue;
      ByteDfa dfa = any_content;
      if (alt.enum_values) {
        std::vector<ExprPtr> literals;
        for (const auto& v : *alt.enum_values) {
          if (v.is_string()) literals.push_back(bytes_expr(content(v.get<std::string>())));
        }
        dfa = dfa_intersect(dfa, dfa_from_expr(*alt_expr(literals), limits_), limits_);
      }
      if (auto constraint = string_content_dfa(alt)) {
        dfa = dfa_intersect(dfa, *constraint, limits_);
      } else if (alt.min_length > 0 || alt.max_length != UINT64_MAX) {
        dfa = dfa_intersect(dfa, dfa_from_expr(*length_expr(alt), limits_), limits_);
      }
      if (!united) {
        united = std::move(dfa);
      } else {
        // Union via complement of intersection of complements.
        united =
            dfa_complement(dfa_intersect(dfa_complement(*united), dfa_complement(dfa), limits_));
        united = dfa_trim(*united);
      }
    }
    names_dfa = united ? std::move(*united) : ByteDfa{};
    if (!united) names_dfa->start = names_dfa->add_state(false);
    (void)names_schema;
  }

  // Each declared name: the conjunction of what every part says about it.
  struct Member {
    std::string name;
    Conjunction conj;
    bool required;
    bool impossible = false;
  };
  std::vector<Member> members;
  for (const auto& name : names) {
    Member m{name,
             {},
             std::find(flat.required.begin(), flat.required.end(), name) != flat.required.end()};
    for (const auto& part : flat.object_parts) {
      bool declared = false;
      for (const auto& [n, sub] : part.properties) {
        if (n == name) {
          m.conj.push_back(sub);
          declared = true;
        }
      }
      bool matched = false;
      for (const auto& [pattern, sub] : part.patterns) {
        if (pattern_dfa(pattern, part.where).matches(content(name))) {
          m.conj.push_back(sub);
          matched = true;
        }
      }
      if (!declared && !matched && part.additional) m.conj.push_back(*part.additional);
    }
    if (names_dfa && !names_dfa->matches(content(name))) m.impossible = true;
    for (const auto& ref : m.conj) {
      if (ref.node->is_boolean() && !ref.node->get<bool>()) m.impossible = true;
    }
    if (m.impossible && m.required) return nothing_expr();
    if (!m.impossible) members.push_back(std::move(m));
  }

  // Undeclared keys: regions of the key space by which patterns they match.
  std::vector<const ObjectPart*> constraining;
  for (const auto& part : flat.object_parts) {
    if (!part.patterns.empty() || part.additional) constraining.push_back(&part);
  }
  std::vector<std::pair<std::string, SchemaRef>> patterns;
  Conjunction additional;
  bool additional_forbidden = false;
  if (constraining.size() == 1) {
    patterns = constraining[0]->patterns;
    if (constraining[0]->additional) additional.push_back(*constraining[0]->additional);
  } else if (constraining.size() > 1) {
    for (const auto* part : constraining) {
      if (!part->patterns.empty()) {
        unsupported("patternProperties", flat.where,
                    "several subschemas of an allOf constrain undeclared properties");
      }
      additional.push_back(*part->additional);
    }
  }
  for (const auto& ref : additional) {
    if (ref.node->is_boolean() && !ref.node->get<bool>()) additional_forbidden = true;
  }
  if (patterns.size() > 4)
    unsupported("patternProperties", flat.where, "more than 4 patterns in one object");

  std::vector<ExprPtr> extra_members;  // key ":" value for undeclared keys
  if (!(additional_forbidden && patterns.empty())) {
    ByteDfa key_space = canonical_content_dfa();
    if (!names.empty()) {
      std::vector<ExprPtr> literals;
      for (const auto& name : names) literals.push_back(bytes_expr(content(name)));
      key_space = dfa_intersect(
          key_space, dfa_complement(dfa_from_expr(*alt_expr(literals), limits_)), limits_);
    }
    if (names_dfa) key_space = dfa_intersect(key_space, *names_dfa, limits_);
    size_t regions = size_t{1} << patterns.size();
    for (size_t mask = 0; mask < regions; ++mask) {
      Conjunction conj;
      ByteDfa region = key_space;
      for (size_t i = 0; i < patterns.size(); ++i) {
        const ByteDfa& p = pattern_dfa(patterns[i].first, flat.where);
        if (mask & (size_t{1} << i)) {
          region = dfa_intersect(region, p, limits_);
          conj.push_back(patterns[i].second);
        } else {
          region = dfa_intersect(region, dfa_complement(p), limits_);
        }
      }
      if (mask == 0) {
        if (additional_forbidden) continue;
        conj = additional;
      }
      if (region.is_empty()) continue;
      ExprPtr value = value_of_conjunction(conj, flat.where + "/additionalProperties");
      if (value->kind == ExprKind::kNothing) continue;
      extra_members.push_back(
          seq_expr({bytes_expr("\""), dfa_expr(std::make_shared<ByteDfa>(std::move(region))),
                    bytes_expr("\""), colon(), value}));
    }
  }
  ExprPtr extra = alt_expr(extra_members);

  if (flat.min_properties > 0 || flat.max_properties != UINT64_MAX) {
    if (!names.empty() || flat.min_properties > limits_.max_repeat) {
      unsupported(flat.min_properties > 0 ? "minProperties" : "maxProperties", flat.where,
                  "property counts are only expressible for objects without declared properties");
    }
    if (flat.max_properties == 0) return seq_expr({bytes_expr("{"), ws(), bytes_expr("}")});
    uint64_t max = flat.max_properties > limits_.max_repeat ? UINT64_MAX : flat.max_properties;
    uint32_t lo = flat.min_properties > 0 ? static_cast<uint32_t>(flat.min_properties - 1) : 0;
    ExprPtr more = repeat_expr(seq_expr({comma(), extra}), lo,
                               max == UINT64_MAX ? kUnbounded : static_cast<uint32_t>(max - 1));
    ExprPtr body = seq_expr({extra, more});
    return seq_expr({bytes_expr("{"), ws(), flat.min_properties == 0 ? optional_expr(body) : body,
                     ws(), bytes_expr("}")});
  }
  std::vector<ExprPtr> items;
  for (const auto& m : members) {
    items.push_back(seq_expr({bytes_expr(serialize_json_string(m.name)), colon(),
                              value_of_conjunction(m.conj, flat.where + "/properties/" + m.name)}));
  }
  const size_t k = members.size();
  ExprPtr extras_after =
      extra->kind == ExprKind::kNothing ? empty_expr() : star_expr(seq_expr({comma(), extra}));
  // tail[i]: members i.. after something was emitted, then undeclared members.
  std::vector<ExprPtr> tail(k + 1);
  tail[k] = extras_after;
  for (size_t i = k; i-- > 0;) {
    ExprPtr with_comma = seq_expr({comma(), items[i]});
    tail[i] = seq_expr({members[i].required ? with_comma : optional_expr(with_comma), tail[i + 1]});
  }
  // The suffix after member i is a sequence of the later slots; build it flat so the NFA is linear.
  std::vector<ExprPtr> bodies;
  for (size_t f = 0; f < k; ++f) {
    bodies.push_back(seq_expr({items[f], tail[f + 1]}));
    if (members[f].required) break;
  }
  bool all_optional =
      std::none_of(members.begin(), members.end(), [](const Member& m) { return m.required; });
  if (all_optional) {
    bodies.push_back(optional_expr(seq_expr({extra, extras_after})));
  }
  return seq_expr({bytes_expr("{"), ws(), alt_expr(bodies), ws(), bytes_expr("}")});
}

void collect_property_names(const Json& node, std::map<std::string, size_t>& rank) {
  if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (it.key() == "properties" && it.value().is_object()) {
        for (auto p = it.value().begin(); p != it.value().end(); ++p)
          rank.emplace(p.key(), rank.size());
      }
      if ((it.key() == "enum" || it.key() == "const")) {
        std::function<void(const Json&)> values = [&](const Json& v) {
          if (v.is_object()) {
            for (auto p = v.begin(); p != v.end(); ++p) {
              rank.emplace(p.key(), rank.size());
              values(p.value());
            }
          } else if (v.is_array()) {
            for (const auto& x : v) values(x);
          }
        };
        values(it.value());
        continue;
      }
      collect_property_names(it.value(), rank);
    }
  } else if (node.is_array()) {
    for (const auto& item : node) collect_property_names(item, rank);
  }
}

}  // namespace

KeyRank schema_key_rank(const Json& schema) {
  auto rank = std::make_shared<std::map<std::string, size_t>>();
  collect_property_names(schema, *rank);
  return [rank](const std::string& key) {
    auto it = rank->find(key);
    return it == rank->end() ? SIZE_MAX : it->second;
  };
}

Grammar json_schema_to_grammar(const Json& schema, const JsonSchemaOptions& options,
                               const GrammarLimits& limits) {
  SchemaCompiler compiler(schema, options, limits);
  return compiler.compile();
}

Grammar json_schema_to_grammar(std::string_view schema_text, const JsonSchemaOptions& options,
                               const GrammarLimits& limits) {
  Json schema;
  try {
    schema = Json::parse(schema_text);
  } catch (const Json::parse_error& e) {
    DI_THROW("JSON schema is not valid JSON at byte ", e.byte, ": ", e.what());
  }
  return json_schema_to_grammar(schema, options, limits);
}

Grammar any_json_grammar(const JsonSchemaOptions& options) {
  static const Json kEmpty = Json::object();
  SchemaCompiler compiler(kEmpty, options, default_limits());
  return compiler.compile_any();
}

}  // namespace deepinfer::structured
