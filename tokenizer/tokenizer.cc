// Tokenizer::Load and the tokenizer it builds: HF's encode pipeline (added
// tokens, normalizer, pre-tokenizer, BPE, post-processor) and decode
// pipeline (id -> token string, decoder).
#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace lair {
namespace {

using tok::Json;

absl::StatusOr<Json> ReadJson(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open"));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::DataLossError(absl::StrCat(path.string(), ": read failed"));
  }
  try {
    return Json::parse(contents.str());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": invalid JSON: ", e.what()));
  }
}

// What tokenizer_config.json says (all optional).
struct TokenizerConfig {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<bool> add_bos_token;
  std::string chat_template;
};

// bos_token / eos_token: a string, or an AddedToken object with "content".
absl::StatusOr<std::optional<std::string>> ConfigToken(const Json& config, std::string_view key,
                                                       const std::string& where) {
  const Json* field = tok::FindField(config, key);
  if (field == nullptr) return std::optional<std::string>();
  if (field->is_string()) return std::optional<std::string>(field->get<std::string>());
  if (field->is_object()) {
    LAIR_ASSIGN_OR_RETURN(std::string content,
                          tok::RequiredString(*field, "content", tok::FieldPath(where, key)));
    return std::optional<std::string>(std::move(content));
  }
  return tok::FieldError(where, key, "expected a string or an object with \"content\"");
}

absl::StatusOr<TokenizerConfig> ParseConfig(const Json& config, const std::string& where) {
  if (!config.is_object()) return absl::InvalidArgumentError(where + " expected an object");
  TokenizerConfig out;
  LAIR_ASSIGN_OR_RETURN(out.bos_token, ConfigToken(config, "bos_token", where));
  LAIR_ASSIGN_OR_RETURN(out.eos_token, ConfigToken(config, "eos_token", where));
  if (tok::FindField(config, "add_bos_token") != nullptr) {
    LAIR_ASSIGN_OR_RETURN(bool add, tok::OptionalBool(config, "add_bos_token", where, false));
    out.add_bos_token = add;
  }
  if (const Json* chat = tok::FindField(config, "chat_template")) {
    if (chat->is_string()) {
      out.chat_template = chat->get<std::string>();
    } else if (chat->is_array()) {
      const std::string list_where = tok::FieldPath(where, "chat_template");
      for (size_t i = 0; i < chat->size(); ++i) {
        const std::string entry_where = tok::IndexPath(list_where, i);
        LAIR_ASSIGN_OR_RETURN(std::string name,
                              tok::RequiredString((*chat)[i], "name", entry_where));
        if (name != "default") continue;
        LAIR_ASSIGN_OR_RETURN(out.chat_template,
                              tok::RequiredString((*chat)[i], "template", entry_where));
      }
    } else {
      return tok::FieldError(where, "chat_template",
                             "expected a string or a list of {name, template}");
    }
  }
  return out;
}

class HfTokenizer : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(const Json& json,
                                                           const std::string& file,
                                                           const std::optional<Json>& config_json,
                                                           const std::string& config_file);

  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const override;
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;

  int VocabSize() const override { return vocab_size_; }
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    if (auto id = added_->FindByContent(token)) return id;
    return model_->TokenToId(token);
  }
  std::string IdToToken(int32_t id) const override { return std::string(TokenView(id)); }
  bool IsSpecial(int32_t id) const override {
    const tok::AddedToken* token = added_->FindById(id);
    return token != nullptr && token->special;
  }
  bool DependsOnNext(int32_t id) const override {
    return decoder_ != nullptr && decoder_->FusesByteRuns() &&
           tok::ByteFallbackValue(TokenView(id)) >= 0;
  }
  std::string TokenBytes(int32_t id) const override;
  std::optional<int32_t> BosId() const override { return bos_id_; }
  std::optional<int32_t> EosId() const override { return eos_id_; }
  bool AddBosToken() const override { return add_bos_token_; }
  std::string_view ChatTemplate() const override { return chat_template_; }

 private:
  HfTokenizer() = default;

  std::string_view TokenView(int32_t id) const {
    if (const tok::AddedToken* token = added_->FindById(id)) return token->content;
    return model_->IdToToken(id);
  }
  // The first special added token among `names`.
  std::optional<int32_t> WellKnownSpecial(std::initializer_list<std::string_view> names) const {
    for (std::string_view name : names) {
      if (auto id = added_->FindByContent(name); id && IsSpecial(*id)) return id;
    }
    return std::nullopt;
  }
  // Encodes one run of text between raw added tokens.
  void EncodeRun(std::string_view text, bool at_origin, std::vector<int32_t>* ids) const;

  std::unique_ptr<tok::Normalizer> normalizer_;  // may be null
  std::unique_ptr<tok::AddedVocabulary> added_;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer_;  // may be null
  std::unique_ptr<tok::BpeModel> model_;
  std::unique_ptr<tok::PostProcessor> post_processor_;  // may be null
  std::unique_ptr<tok::Decoder> decoder_;               // may be null
  int vocab_size_ = 0;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  bool add_bos_token_ = false;
  std::string chat_template_;
};

absl::StatusOr<std::unique_ptr<Tokenizer>> HfTokenizer::Create(
    const Json& json, const std::string& file, const std::optional<Json>& config_json,
    const std::string& config_file) {
  const std::string where = file + ":";
  if (!json.is_object()) return absl::InvalidArgumentError(file + ": expected a JSON object");
  std::unique_ptr<HfTokenizer> t(new HfTokenizer());
  if (const Json* normalizer = tok::FindField(json, "normalizer")) {
    LAIR_ASSIGN_OR_RETURN(t->normalizer_, tok::Normalizer::FromJson(
                                              *normalizer, tok::FieldPath(where, "normalizer")));
  }
  LAIR_ASSIGN_OR_RETURN(t->added_, tok::AddedVocabulary::FromJson(
                                       tok::FindField(json, "added_tokens"), t->normalizer_.get(),
                                       tok::FieldPath(where, "added_tokens")));
  if (const Json* pre = tok::FindField(json, "pre_tokenizer")) {
    LAIR_ASSIGN_OR_RETURN(t->pre_tokenizer_, tok::PreTokenizer::FromJson(
                                                 *pre, tok::FieldPath(where, "pre_tokenizer")));
  }
  const Json* model = tok::FindField(json, "model");
  if (model == nullptr) return tok::FieldError(where, "model", "missing");
  LAIR_ASSIGN_OR_RETURN(t->model_, tok::BpeModel::FromJson(*model, tok::FieldPath(where, "model")));
  if (const Json* post = tok::FindField(json, "post_processor")) {
    LAIR_ASSIGN_OR_RETURN(t->post_processor_, tok::PostProcessor::FromJson(
                                                  *post, tok::FieldPath(where, "post_processor")));
  }
  if (const Json* decoder = tok::FindField(json, "decoder")) {
    LAIR_ASSIGN_OR_RETURN(t->decoder_,
                          tok::Decoder::FromJson(*decoder, tok::FieldPath(where, "decoder")));
  }

  t->vocab_size_ = t->model_->IdLimit();
  for (const tok::AddedToken& token : t->added_->tokens()) {
    t->vocab_size_ = std::max(t->vocab_size_, token.id + 1);
  }

  TokenizerConfig config;
  if (config_json.has_value()) {
    LAIR_ASSIGN_OR_RETURN(config, ParseConfig(*config_json, config_file + ":"));
  }
  const auto resolve = [&](const std::optional<std::string>& token,
                           std::string_view key) -> absl::StatusOr<std::optional<int32_t>> {
    if (!token.has_value()) return std::optional<int32_t>();
    auto id = t->TokenToId(*token);
    if (!id) {
      return tok::FieldError(config_file + ":", key,
                             absl::StrCat("'", *token, "' is not a token of ", file));
    }
    return id;
  };
  LAIR_ASSIGN_OR_RETURN(t->bos_id_, resolve(config.bos_token, "bos_token"));
  LAIR_ASSIGN_OR_RETURN(t->eos_id_, resolve(config.eos_token, "eos_token"));
  const std::optional<int32_t> leading =
      t->post_processor_ != nullptr ? t->post_processor_->LeadingId() : std::nullopt;
  if (!t->bos_id_) t->bos_id_ = leading;
  if (!t->eos_id_)
    t->eos_id_ = t->WellKnownSpecial({"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>"});
  t->add_bos_token_ = config.add_bos_token.value_or(leading.has_value() && leading == t->bos_id_);
  t->chat_template_ = std::move(config.chat_template);
  return std::unique_ptr<Tokenizer>(std::move(t));
}

void HfTokenizer::EncodeRun(std::string_view text, bool at_origin,
                            std::vector<int32_t>* ids) const {
  std::string normalized(text);
  if (normalizer_ != nullptr) normalizer_->Normalize(&normalized);
  std::vector<tok::AddedVocabulary::Span> spans;
  added_->Split(normalized, /*normalized=*/true, &spans);
  std::vector<tok::PreToken> pieces;
  for (const auto& span : spans) {
    if (span.id >= 0) {
      ids->push_back(span.id);
      continue;
    }
    pieces.clear();
    pieces.push_back(
        {normalized.substr(span.begin, span.end - span.begin), at_origin && span.begin == 0});
    if (pre_tokenizer_ != nullptr) pre_tokenizer_->PreTokenize(&pieces);
    for (const tok::PreToken& piece : pieces) model_->Tokenize(piece.text, ids);
  }
}

std::vector<int32_t> HfTokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  // Rust strings are valid UTF-8; invalid input is repaired the way Python's
  // errors="replace" would hand it over.
  std::string repaired;
  if (!tok::IsValidUtf8(text)) {
    repaired = tok::Utf8Lossy(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<tok::AddedVocabulary::Span> spans;
  added_->Split(text, /*normalized=*/false, &spans);
  for (const auto& span : spans) {
    if (span.id >= 0) {
      ids.push_back(span.id);
    } else {
      EncodeRun(text.substr(span.begin, span.end - span.begin), span.begin == 0, &ids);
    }
  }
  if (add_special_tokens && post_processor_ != nullptr) post_processor_->AddSpecialTokens(&ids);
  return ids;
}

std::string HfTokenizer::TokenBytes(int32_t id) const {
  const std::string_view token = TokenView(id);
  if (decoder_ != nullptr && added_->FindById(id) == nullptr) {
    std::string bytes;
    if (decoder_->DecodesByteLevel() && tok::ByteLevelDecode(token, &bytes)) return bytes;
    const int byte = tok::ByteFallbackValue(token);
    if (decoder_->FusesByteRuns() && byte >= 0) return std::string(1, static_cast<char>(byte));
  }
  return Decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false);
}

std::string HfTokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string_view token = TokenView(id);
    if (token.empty()) continue;  // unknown id: HF skips it
    if (skip_special_tokens && added_->IsSpecialContent(token)) continue;
    tokens.emplace_back(token);
  }
  std::string text;
  if (decoder_ == nullptr) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) text.push_back(' ');
      text.append(tokens[i]);
    }
    return text;
  }
  decoder_->DecodeChain(&tokens);
  for (const std::string& token : tokens) text.append(token);
  return text;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  const bool is_directory = fs::is_directory(path, error);
  const fs::path file = is_directory ? fs::path(path) / "tokenizer.json" : fs::path(path);
  if (!fs::exists(file, error)) {
    return absl::NotFoundError(absl::StrCat(file.string(), ": no such file"));
  }
  LAIR_ASSIGN_OR_RETURN(Json json, ReadJson(file));
  const fs::path config_file = file.parent_path() / "tokenizer_config.json";
  std::optional<Json> config;
  if (fs::exists(config_file, error)) {
    LAIR_ASSIGN_OR_RETURN(config, ReadJson(config_file));
  }
  return HfTokenizer::Create(json, file.string(), config, config_file.string());
}

}  // namespace lair
