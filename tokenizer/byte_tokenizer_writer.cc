#include "tokenizer/byte_tokenizer_writer.h"

#include <array>
#include <filesystem>
#include <fstream>

#include "nlohmann/json.hpp"

namespace lair {
namespace {

using Json = nlohmann::ordered_json;

// GPT-2's reversible byte -> character mapping, as UTF-8: printable bytes
// stand for themselves, the rest take code points from U+0100 upwards.
std::string ByteCharacter(int byte) {
  static const auto kCodePoints = [] {
    std::array<int, 256> points{};
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      points[b] = printable ? b : next++;
    }
    return points;
  }();
  const int cp = kCodePoints[byte];
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

Json AddedToken(int id, const char* content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

absl::Status WriteJson(const std::filesystem::path& path, const Json& json) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << json.dump(2) << "\n";
  out.close();
  if (!out) return absl::InternalError("cannot write " + path.string());
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteByteTokenizer(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InvalidArgumentError("cannot create " + dir + ": " + ec.message());

  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteCharacter(b)] = b;
  Json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", Json::array({AddedToken(256, "<|bos|>"), AddedToken(257, "<|eos|>")})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", Json::array({{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", Json::array({{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 1}}}},
                              {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
        {"special_tokens",
         {{"<|bos|>",
           {{"id", "<|bos|>"},
            {"ids", Json::array({256})},
            {"tokens", Json::array({"<|bos|>"})}}}}}}},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", true},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", Json::array()}}}};
  Json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                 {"bos_token", "<|bos|>"},
                 {"eos_token", "<|eos|>"},
                 {"add_bos_token", true},
                 {"model_max_length", 32768},
                 {"chat_template",
                  "{{ bos_token }}{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' "
                  "+ message['content'] + "
                  "eos_token + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ "
                  "'<|assistant|>\\n' }}{% endif %}"}};
  const std::filesystem::path base(dir);
  LAIR_RETURN_IF_ERROR(WriteJson(base / "tokenizer.json", tokenizer));
  return WriteJson(base / "tokenizer_config.json", config);
}

}  // namespace lair
