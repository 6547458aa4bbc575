#include "structured/number_language.h"

#include <map>
#include <tuple>

#include "core/error.h"

namespace deepinfer::structured {
namespace {

ExprPtr digits(char lo, char hi) {
  return byte_range_expr(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
}
ExprPtr any_digit() {
  return digits('0', '9');
}
ExprPtr nonzero_digit() {
  return digits('1', '9');
}
ExprPtr lit(const std::string& s) {
  return bytes_expr(s);
}
ExprPtr any_fraction() {
  return optional_expr(seq_expr({lit("."), repeat_expr(any_digit(), 1, kUnbounded)}));
}
ExprPtr nonneg_all() {
  return seq_expr(
      {alt_expr({lit("0"), seq_expr({nonzero_digit(), star_expr(any_digit())})}), any_fraction()});
}
ExprPtr zero_numeral() {
  return seq_expr(
      {lit("0"), optional_expr(seq_expr({lit("."), repeat_expr(lit("0"), 1, kUnbounded)}))});
}
// Non-zero non-negative numerals.
ExprPtr positive_numeral() {
  return alt_expr(
      {seq_expr({nonzero_digit(), star_expr(any_digit()), any_fraction()}),
       seq_expr({lit("0."), star_expr(any_digit()), nonzero_digit(), star_expr(any_digit())})});
}

ExprPtr at_least_nonneg(const Decimal& x, bool inclusive) {
  const std::string& I = x.integer;
  const std::string& F = x.fraction;
  const uint32_t n = static_cast<uint32_t>(I.size());
  std::vector<ExprPtr> alts;
  if (I == "0") {
    alts.push_back(seq_expr({nonzero_digit(), star_expr(any_digit()), any_fraction()}));
  } else {
    alts.push_back(
        seq_expr({nonzero_digit(), repeat_expr(any_digit(), n, kUnbounded), any_fraction()}));
    for (uint32_t k = 0; k < n; ++k) {
      if (I[k] == '9') continue;
      alts.push_back(seq_expr({lit(I.substr(0, k)), digits(static_cast<char>(I[k] + 1), '9'),
                               repeat_expr(any_digit(), n - k - 1, n - k - 1), any_fraction()}));
    }
  }
  if (F.empty()) {
    if (inclusive) {
      alts.push_back(seq_expr({lit(I), any_fraction()}));
    } else {
      alts.push_back(seq_expr(
          {lit(I + "."), star_expr(any_digit()), nonzero_digit(), star_expr(any_digit())}));
    }
  } else {
    for (size_t k = 0; k < F.size(); ++k) {
      if (F[k] == '9') continue;
      alts.push_back(seq_expr({lit(I + "." + F.substr(0, k)),
                               digits(static_cast<char>(F[k] + 1), '9'), star_expr(any_digit())}));
    }
    if (inclusive) {
      alts.push_back(seq_expr({lit(I + "." + F), star_expr(any_digit())}));
    } else {
      alts.push_back(seq_expr(
          {lit(I + "." + F), star_expr(lit("0")), nonzero_digit(), star_expr(any_digit())}));
    }
  }
  return alt_expr(std::move(alts));
}

ExprPtr at_most_nonneg(const Decimal& x, bool inclusive) {
  const std::string& I = x.integer;
  const std::string& F = x.fraction;
  const uint32_t n = static_cast<uint32_t>(I.size());
  std::vector<ExprPtr> alts;
  if (I != "0") {
    if (n >= 2) {
      alts.push_back(seq_expr(
          {alt_expr({lit("0"), seq_expr({nonzero_digit(), repeat_expr(any_digit(), 0, n - 2)})}),
           any_fraction()}));
    }
    for (uint32_t k = 0; k < n; ++k) {
      char lo = (k == 0 && n > 1) ? '1' : '0';
      if (I[k] <= lo) continue;
      alts.push_back(seq_expr({lit(I.substr(0, k)), digits(lo, static_cast<char>(I[k] - 1)),
                               repeat_expr(any_digit(), n - k - 1, n - k - 1), any_fraction()}));
    }
  }
  if (F.empty()) {
    if (inclusive) {
      alts.push_back(seq_expr(
          {lit(I), optional_expr(seq_expr({lit("."), repeat_expr(lit("0"), 1, kUnbounded)}))}));
    }
  } else {
    alts.push_back(lit(I));
    for (size_t k = 0; k < F.size(); ++k) {
      if (F[k] == '0') continue;
      alts.push_back(seq_expr({lit(I + "." + F.substr(0, k)),
                               digits('0', static_cast<char>(F[k] - 1)), star_expr(any_digit())}));
    }
    for (size_t k = 1; k < F.size(); ++k) alts.push_back(lit(I + "." + F.substr(0, k)));
    if (inclusive) alts.push_back(seq_expr({lit(I + "." + F), star_expr(lit("0"))}));
  }
  return alt_expr(std::move(alts));
}

}  // namespace

Decimal parse_decimal(const std::string& text) {
  size_t pos = 0;
  Decimal out;
  if (pos < text.size() && (text[pos] == '-' || text[pos] == '+'))
    out.negative = text[pos++] == '-';
  std::string int_digits, frac_digits;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])))
    int_digits += text[pos++];
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])))
      frac_digits += text[pos++];
  }
  long exponent = 0;
  if (pos < text.size() && (text[pos] == 'e' || text[pos] == 'E')) {
    ++pos;
    bool neg = false;
    if (pos < text.size() && (text[pos] == '-' || text[pos] == '+')) neg = text[pos++] == '-';
    size_t start = pos;
    while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) {
      exponent = exponent * 10 + (text[pos++] - '0');
      if (exponent > 400) DI_THROW("number '", text, "' has an exponent out of range");
    }
    if (pos == start) DI_THROW("number '", text, "' has an empty exponent");
    if (neg) exponent = -exponent;
  }
  if (pos != text.size() || (int_digits.empty() && frac_digits.empty())) {
    DI_THROW("'", text, "' is not a decimal number");
  }
  std::string all = int_digits + frac_digits;
  long point = static_cast<long>(int_digits.size()) + exponent;
  if (point < 0) {
    all = std::string(static_cast<size_t>(-point), '0') + all;
    point = 0;
  }
  if (point > static_cast<long>(all.size()))
    all += std::string(static_cast<size_t>(point) - all.size(), '0');
  out.integer = all.substr(0, static_cast<size_t>(point));
  out.fraction = all.substr(static_cast<size_t>(point));
  size_t nz = out.integer.find_first_not_of('0');
  out.integer = nz == std::string::npos ? "0" : out.integer.substr(nz);
  size_t last = out.fraction.find_last_not_of('0');
  out.fraction = last == std::string::npos ? "" : out.fraction.substr(0, last + 1);
  if (out.is_zero()) out.negative = false;
  return out;
}

ExprPtr decimal_numeral_expr() {
  static const ExprPtr kExpr = seq_expr({optional_expr(lit("-")), nonneg_all()});
  return kExpr;
}

ExprPtr integer_numeral_expr() {
  static const ExprPtr kExpr =
      seq_expr({optional_expr(lit("-")),
                alt_expr({lit("0"), seq_expr({nonzero_digit(), star_expr(any_digit())})}),
                optional_expr(seq_expr({lit("."), repeat_expr(lit("0"), 1, kUnbounded)}))});
  return kExpr;
}

ExprPtr decimal_equal_expr(const Decimal& value) {
  if (value.is_zero()) return seq_expr({optional_expr(lit("-")), zero_numeral()});
  std::string sign = value.negative ? "-" : "";
  if (value.fraction.empty()) {
    return seq_expr({lit(sign + value.integer),
                     optional_expr(seq_expr({lit("."), repeat_expr(lit("0"), 1, kUnbounded)}))});
  }
  return seq_expr({lit(sign + value.integer + "." + value.fraction), star_expr(lit("0"))});
}

ExprPtr decimal_at_least_expr(const Decimal& bound, bool inclusive) {
  if (!bound.negative) {
    ExprPtr nonneg = at_least_nonneg(bound, inclusive);
    if (bound.is_zero() && inclusive)
      return alt_expr({nonneg, seq_expr({lit("-"), zero_numeral()})});
    return nonneg;
  }
  Decimal magnitude = bound;
  magnitude.negative = false;
  return alt_expr({nonneg_all(), seq_expr({lit("-"), at_most_nonneg(magnitude, inclusive)})});
}

ExprPtr decimal_at_most_expr(const Decimal& bound, bool inclusive) {
  if (!bound.negative) {
    std::vector<ExprPtr> alts = {at_most_nonneg(bound, inclusive),
                                 seq_expr({lit("-"), positive_numeral()})};
    if (!bound.is_zero() || inclusive) alts.push_back(seq_expr({lit("-"), zero_numeral()}));
    return alt_expr(std::move(alts));
  }
  Decimal magnitude = bound;
  magnitude.negative = false;
  return seq_expr({lit("-"), at_least_nonneg(magnitude, inclusive)});
}

ByteDfa decimal_multiple_of_dfa(const Decimal& step, const GrammarLimits& limits) {
  std::string digits_text = step.integer + step.fraction;
  size_t nz = digits_text.find_first_not_of('0');
  if (step.negative || nz == std::string::npos) DI_THROW("multipleOf must be greater than 0");
  digits_text = digits_text.substr(nz);
  if (digits_text.size() > 9)
    DI_THROW("multipleOf ", digits_text, " has too many significant digits to enforce");
  const uint64_t P = std::stoull(digits_text);
  const size_t Q = step.fraction.size();
  if (P * (Q + 3) > limits.max_byte_dfa_states) {
    DI_THROW("multipleOf with ", digits_text.size(), " significant digits and ", Q,
             " decimals needs more than ", limits.max_byte_dfa_states, " automaton states");
  }
  std::vector<uint64_t> pow10(Q + 1, 1 % P);
  for (size_t i = 1; i <= Q; ++i) pow10[i] = (pow10[i - 1] * 10) % P;

  // State kinds: 0 start, 1 after sign, 2 integer digits (r), 3 integer "0", 4 fraction (r, c,
  // nonempty), 5 zero tail (r).
  using Key = std::tuple<int, uint64_t, size_t, bool>;
  ByteDfa dfa;
  std::map<Key, int32_t> ids;
  std::vector<Key> pending;
  auto accepting = [&](const Key& k) {
    auto [kind, r, c, nonempty] = k;
    switch (kind) {
      case 2:
        return (r * pow10[Q]) % P == 0;
      case 3:
        return true;
      case 4:
        return nonempty && (r * pow10[Q - c]) % P == 0;
      case 5:
        return r == 0;
      default:
        return false;
    }
  };
  auto intern = [&](const Key& k) {
    auto it = ids.find(k);
    if (it != ids.end()) return it->second;
    int32_t id = dfa.add_state(accepting(k));
    ids.emplace(k, id);
    pending.push_back(k);
    return id;
  };
  dfa.start = intern({0, 0, 0, false});
  for (size_t index = 0; index < pending.size(); ++index) {
    auto [kind, r, c, nonempty] = pending[index];
    auto set = [&](char byte, const Key& target) {
      int32_t t = intern(target);
      dfa.next[index * 256 + static_cast<uint8_t>(byte)] = t;
    };
    switch (kind) {
      case 0:
        set('-', {1, 0, 0, false});
        [[fallthrough]];
      case 1:
        set('0', {3, 0, 0, false});
        for (char d = '1'; d <= '9'; ++d) set(d, {2, static_cast<uint64_t>(d - '0') % P, 0, false});
        break;
      case 2:
        for (char d = '0'; d <= '9'; ++d)
          set(d, {2, (r * 10 + static_cast<uint64_t>(d - '0')) % P, 0, false});
        set('.', {4, r, 0, false});
        break;
      case 3:
        set('.', {4, 0, 0, false});
        break;
      case 4:
        if (c < Q) {
          for (char d = '0'; d <= '9'; ++d)
            set(d, {4, (r * 10 + static_cast<uint64_t>(d - '0')) % P, c + 1, true});
        } else {
          set('0', {5, r, 0, false});
        }
        break;
      case 5:
        set('0', {5, r, 0, false});
        break;
      default:
        break;
    }
  }
  return dfa;
}

}  // namespace deepinfer::structured
