// The BPE model of HF `tokenizers`: a vocabulary, merges ranked by their
// position in the list ("a b" strings or [a, b] pairs), unk_token with
// fuse_unk, byte_fallback (a character outside the vocabulary becomes its
// <0xAB> byte pieces), ignore_merges (a word that is itself in the vocabulary
// is one token), continuing_subword_prefix and end_of_word_suffix.
//
// Merging follows HF exactly: starting from one symbol per character, apply
// the lowest-ranked adjacent pair, the leftmost first, until none applies.
// A heap keeps this O(n log n), which matters for SentencePiece-style
// tokenizers with no pre-tokenizer, where a whole text is one word. Results
// for words under 256 bytes are cached.
//
// Thread safety: const methods may run on many threads at once; the cache is
// split into shards, each behind its own mutex.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/status.h"
#include "tokenizer/json_fields.h"

namespace lair::tok {

class BpeModel {
 public:
  // `json` is the "model" object of tokenizer.json; errors name `where`.
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const Json& json,
                                                            const std::string& where);

  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of `word` (valid UTF-8, one pre-tokenized piece).
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // Empty when no token has `id`.
  std::string_view IdToToken(int32_t id) const;
  // One past the largest id in the vocabulary.
  int32_t IdLimit() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct MergeInfo {
    uint32_t rank;
    int32_t new_id;
  };
  struct CacheShard {
    std::mutex mu;
    absl::flat_hash_map<std::string, std::vector<int32_t>> words;  // guarded by mu
  };
  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kCacheWordsPerShard = 4096;
  static constexpr size_t kMaxCachedBytes = 256;
  // Characters below this code point have their single-character id in a
  // table, the hot path of byte-level vocabularies.
  static constexpr char32_t kCharTableSize = 0x800;

  BpeModel() = default;

  absl::Status AddMerge(std::string_view left, std::string_view right, uint32_t rank,
                        const std::string& where);
  const MergeInfo* FindMerge(int32_t left, int32_t right) const;
  // The id of the character `c` (UTF-8 `utf8`) as a symbol, or -1.
  int32_t CharId(char32_t c, std::string_view utf8, bool first, bool last) const;
  // Runs the merges on `word` and appends the resulting ids.
  void MergeWord(std::string_view word, std::vector<int32_t>* ids) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  absl::flat_hash_map<uint64_t, MergeInfo> merges_;  // key: left id << 32 | right id
  std::vector<int32_t> char_ids_;                    // kCharTableSize entries, -1 when absent
  std::array<int32_t, 256> byte_ids_{};              // <0xAB> ids, -1 when absent
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace lair::tok
