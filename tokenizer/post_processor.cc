#include "tokenizer/post_processor.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace lair::tok {
namespace {

class SequenceProcessor : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void AddSpecialTokens(std::vector<int32_t>* ids) const override {
    for (const auto& step : steps_) step->AddSpecialTokens(ids);
  }
  std::optional<int32_t> LeadingId() const override {
    // A later step wraps the earlier steps' output, so its prefix is first.
    for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) {
      if (auto id = (*it)->LeadingId()) return id;
    }
    return std::nullopt;
  }

 private:
  const std::vector<std::unique_ptr<PostProcessor>> steps_;
};

class ByteLevelProcessor : public PostProcessor {
 public:
  void AddSpecialTokens(std::vector<int32_t>*) const override {}
};

// The "single" template: ids before the sequence and ids after it.
class TemplateProcessor : public PostProcessor {
 public:
  TemplateProcessor(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void AddSpecialTokens(std::vector<int32_t>* ids) const override {
    ids->insert(ids->begin(), before_.begin(), before_.end());
    ids->insert(ids->end(), after_.begin(), after_.end());
  }
  std::optional<int32_t> LeadingId() const override {
    if (before_.empty()) return std::nullopt;
    return before_.front();
  }

 private:
  const std::vector<int32_t> before_;
  const std::vector<int32_t> after_;
};

absl::StatusOr<std::unique_ptr<PostProcessor>> Template(const Json& json,
                                                        const std::string& where) {
  LAIR_ASSIGN_OR_RETURN(const Json* single, RequiredArray(json, "single", where));
  LAIR_ASSIGN_OR_RETURN(const Json* specials, RequiredObject(json, "special_tokens", where));
  const std::string single_where = FieldPath(where, "single");
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& piece = (*single)[i];
    const std::string piece_where = IndexPath(single_where, i);
    if (const Json* sequence = FindField(piece, "Sequence")) {
      LAIR_ASSIGN_OR_RETURN(std::string name, RequiredString(*sequence, "id", piece_where));
      if (name != "A" || seen_sequence) {
        return absl::InvalidArgumentError(
            absl::StrCat(piece_where, ": the single template holds sequence A once"));
      }
      seen_sequence = true;
      continue;
    }
    const Json* special = FindField(piece, "SpecialToken");
    if (special == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(piece_where, ": expected {\"Sequence\": ...} or {\"SpecialToken\": ...}"));
    }
    LAIR_ASSIGN_OR_RETURN(std::string name,
                          RequiredString(*special, "id", FieldPath(piece_where, "SpecialToken")));
    const Json* entry = FindField(*specials, name);
    if (entry == nullptr) {
      return FieldError(FieldPath(where, "special_tokens"), name, "missing");
    }
    const std::string entry_where = FieldPath(FieldPath(where, "special_tokens"), name);
    LAIR_ASSIGN_OR_RETURN(const Json* ids, RequiredArray(*entry, "ids", entry_where));
    for (const Json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return FieldError(entry_where, "ids", "expected non-negative ids");
      }
      (seen_sequence ? after : before).push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  if (!seen_sequence) {
    return absl::InvalidArgumentError(absl::StrCat(single_where, ": no sequence A"));
  }
  return std::unique_ptr<PostProcessor>(new TemplateProcessor(std::move(before), std::move(after)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PostProcessor>> PostProcessor::FromJson(const Json& json,
                                                                       const std::string& where) {
  LAIR_ASSIGN_OR_RETURN(std::string type, RequiredString(json, "type", where));
  if (type == "Sequence") {
    LAIR_ASSIGN_OR_RETURN(auto steps, SequenceSteps<PostProcessor>(json, "processors", where));
    return std::unique_ptr<PostProcessor>(new SequenceProcessor(std::move(steps)));
  }
  if (type == "ByteLevel") return std::unique_ptr<PostProcessor>(new ByteLevelProcessor());
  if (type == "TemplateProcessing") return Template(json, where);
  return FieldError(where, "type", absl::StrCat("unsupported post-processor '", type, "'"));
}

}  // namespace lair::tok
