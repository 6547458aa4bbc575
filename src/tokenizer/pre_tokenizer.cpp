#include "tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace deepinfer::tokenizer {
namespace {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

SplitBehavior parse_behavior(const std::string& name, const std::string& origin) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  DI_THROW("tokenizer.json: ", origin, ".behavior \"", name,
           "\" is unknown (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
}

struct Piece {
  std::size_t begin;
  std::size_t end;
  bool is_match;
};

// Applies a split behaviour to the partition of one piece into matches and gaps (HF's
// NormalizedString::split), appending the surviving sub-pieces.
void apply_behavior(std::string_view text, std::vector<Piece>& parts, SplitBehavior behavior,
                    std::vector<std::string_view>& out) {
  std::vector<Piece> merged;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      merged = std::move(parts);
      break;
    case SplitBehavior::kRemoved:
      for (const Piece& p : parts) {
        if (!p.is_match) merged.push_back(p);
      }
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Piece& p : parts) {
        if (p.is_match && !previous_match && !merged.empty()) {
          merged.back().end = p.end;
        } else {
          merged.push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().begin = it->begin;
        } else {
          merged.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Piece& p : parts) {
        if (p.is_match == previous_match && !merged.empty()) {
          merged.back().end = p.end;
        } else {
          merged.push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
    }
  }
  for (const Piece& p : merged) {
    if (p.end > p.begin) out.push_back(text.substr(p.begin, p.end - p.begin));
  }
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> regex, std::string literal, SplitBehavior behavior,
                    bool invert)
      : regex_(std::move(regex)),
        literal_(std::move(literal)),
        behavior_(behavior),
        invert_(invert) {}

  void split(std::vector<std::string_view>& pieces, PreTokenizeScratch& scratch) const override {
    scratch.next.clear();
    std::vector<Piece> parts;
    for (std::string_view piece : pieces) {
      if (piece.empty()) continue;
      scratch.matches.clear();
      find(piece, scratch.matches);
      if (scratch.matches.empty() && !invert_ && behavior_ != SplitBehavior::kRemoved) {
        scratch.next.push_back(piece);  // fast path: nothing to split
        continue;
      }
      parts.clear();
      std::size_t previous = 0;
      for (const Span& m : scratch.matches) {
        if (m.begin != previous) parts.push_back({previous, m.begin, false});
        parts.push_back({m.begin, m.end, true});
        previous = m.end;
      }
      if (previous != piece.size()) parts.push_back({previous, piece.size(), false});
      if (invert_) {
        for (Piece& p : parts) p.is_match = !p.is_match;
      }
      apply_behavior(piece, parts, behavior_, scratch.next);
    }
    pieces.swap(scratch.next);
  }

 private:
  void find(std::string_view piece, std::vector<Span>& matches) const {
    if (regex_) {
      regex_->find_all(piece, matches);
      return;
    }
    if (literal_.empty()) return;
    for (std::size_t found = piece.find(literal_); found != std::string_view::npos;
         found = piece.find(literal_, found + literal_.size())) {
      matches.push_back({found, found + literal_.size()});
    }
  }

  std::unique_ptr<Regex> regex_;
  std::string literal_;
  SplitBehavior behavior_;
  bool invert_;
};

// GPT-2's pre-tokenization regex, used by ByteLevel when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const std::string& origin)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) {
      split_ = std::make_unique<SplitPreTokenizer>(std::make_unique<Regex>(kGpt2Pattern, origin),
                                                   "", SplitBehavior::kIsolated, false);
    }
  }

  void split(std::vector<std::string_view>& pieces, PreTokenizeScratch& scratch) const override {
    if (add_prefix_space_) {
      for (std::string_view& piece : pieces) {
        if (!piece.empty() && piece.front() != ' ') {
          scratch.arena.push_back(" " + std::string(piece));
          piece = scratch.arena.back();
        }
      }
    }
    if (split_) split_->split(pieces, scratch);
  }
  bool has_byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  std::unique_ptr<SplitPreTokenizer> split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void split(std::vector<std::string_view>& pieces, PreTokenizeScratch& scratch) const override {
    for (const auto& step : steps_) step->split(pieces, scratch);
  }
  bool has_byte_level() const override {
    for (const auto& step : steps_) {
      if (step->has_byte_level()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec,
                                                 const std::string& origin) {
  if (spec.is_null()) return nullptr;
  if (!spec.is_object() || !spec.contains("type")) {
    DI_THROW("tokenizer.json: ", origin, " must be an object with a \"type\"");
  }
  const std::string type = spec["type"].get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    const auto& list = spec.at("pretokenizers");
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto step = make_pre_tokenizer(list[i], concat(origin, ".pretokenizers[", i, "]"));
      if (step) steps.push_back(std::move(step));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Split") {
    const auto& pattern = spec.at("pattern");
    const SplitBehavior behavior = parse_behavior(spec.at("behavior").get<std::string>(), origin);
    const bool invert = spec.value("invert", false);
    if (pattern.contains("Regex")) {
      return std::make_unique<SplitPreTokenizer>(
          std::make_unique<Regex>(pattern["Regex"].get<std::string>(), origin + ".pattern"), "",
          behavior, invert);
    }
    if (pattern.contains("String")) {
      return std::make_unique<SplitPreTokenizer>(nullptr, pattern["String"].get<std::string>(),
                                                 behavior, invert);
    }
    DI_THROW("tokenizer.json: ", origin, ".pattern must hold \"String\" or \"Regex\"");
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(spec.value("add_prefix_space", true),
                                                   spec.value("use_regex", true), origin);
  }
  DI_THROW("tokenizer.json: ", origin, ": pre-tokenizer type \"", type,
           "\" is not supported (supported: Sequence, Split, ByteLevel)");
}

}  // namespace deepinfer::tokenizer
