#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <functional>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tokenizer/unicode.h"

namespace lair::tok {
namespace {

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// A symbol of the word being merged: a doubly linked list over a vector, so
// merging never moves symbols and heap entries can name them by index.
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  int32_t bytes;  // 0 once merged into its left neighbour
};

// Per-thread scratch space, so the hot path allocates nothing.
struct MergeScratch {
  std::vector<Symbol> symbols;
  // Candidate merges as rank << 32 | left position: a min-heap orders them
  // by rank, then leftmost first, as HF's BinaryHeap of Merge does.
  std::vector<uint64_t> heap;
};

void AddSymbol(int32_t id, int32_t bytes, std::vector<Symbol>* symbols) {
  const auto index = static_cast<int32_t>(symbols->size());
  if (!symbols->empty()) symbols->back().next = index;
  symbols->push_back({id, index - 1, -1, bytes});
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const Json& json,
                                                             const std::string& where) {
  if (!json.is_object()) return absl::InvalidArgumentError(where + ": expected an object");
  LAIR_ASSIGN_OR_RETURN(auto type, OptionalString(json, "type", where));
  if (type.has_value() && *type != "BPE") {
    return FieldError(where, "type",
                      absl::StrCat("unsupported model '", *type, "' (only BPE is implemented)"));
  }
  if (const Json* dropout = FindField(json, "dropout"); dropout != nullptr) {
    if (!dropout->is_number()) return FieldError(where, "dropout", "expected a number");
    if (dropout->get<double>() > 0.0) {
      return FieldError(where, "dropout", "BPE dropout is random at encode time; unsupported");
    }
  }
  std::unique_ptr<BpeModel> model(new BpeModel());
  LAIR_ASSIGN_OR_RETURN(model->fuse_unk_, OptionalBool(json, "fuse_unk", where, false));
  LAIR_ASSIGN_OR_RETURN(model->byte_fallback_, OptionalBool(json, "byte_fallback", where, false));
  LAIR_ASSIGN_OR_RETURN(model->ignore_merges_, OptionalBool(json, "ignore_merges", where, false));
  LAIR_ASSIGN_OR_RETURN(auto prefix, OptionalString(json, "continuing_subword_prefix", where));
  model->continuing_subword_prefix_ = prefix.value_or("");
  LAIR_ASSIGN_OR_RETURN(auto suffix, OptionalString(json, "end_of_word_suffix", where));
  model->end_of_word_suffix_ = suffix.value_or("");

  LAIR_ASSIGN_OR_RETURN(const Json* vocab, RequiredObject(json, "vocab", where));
  model->vocab_.reserve(vocab->size());
  int64_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX) {
      return FieldError(FieldPath(where, "vocab"), it.key(), "expected a non-negative id");
    }
    const int64_t id = it.value().get<int64_t>();
    model->vocab_[it.key()] = static_cast<int32_t>(id);
    max_id = std::max(max_id, id);
  }
  model->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [token, id] : model->vocab_) model->id_to_token_[id] = token;

  LAIR_ASSIGN_OR_RETURN(auto unk, OptionalString(json, "unk_token", where));
  if (unk.has_value()) {
    // HF fails an encode that needs a missing unk token; LAIR drops the
    // character instead, since Encode cannot fail.
    if (auto id = model->TokenToId(*unk)) model->unk_id_ = *id;
  }
  for (int b = 0; b < 256; ++b) {
    model->byte_ids_[b] = model->TokenToId(absl::StrFormat("<0x%02X>", b)).value_or(-1);
  }
  model->char_ids_.assign(kCharTableSize, -1);
  for (char32_t c = 0; c < kCharTableSize; ++c) {
    std::string utf8;
    AppendUtf8(c, &utf8);
    model->char_ids_[c] = model->TokenToId(utf8).value_or(-1);
  }

  LAIR_ASSIGN_OR_RETURN(const Json* merges, RequiredArray(json, "merges", where));
  const std::string merges_where = FieldPath(where, "merges");
  model->merges_.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const Json& merge = (*merges)[rank];
    const std::string merge_where = IndexPath(merges_where, rank);
    if (merge.is_string()) {
      const std::string& line = merge.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(merge_where, ": expected \"left right\", got \"", line, "\""));
      }
      LAIR_RETURN_IF_ERROR(model->AddMerge(std::string_view(line).substr(0, space),
                                           std::string_view(line).substr(space + 1),
                                           static_cast<uint32_t>(rank), merge_where));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      LAIR_RETURN_IF_ERROR(model->AddMerge(merge[0].get_ref<const std::string&>(),
                                           merge[1].get_ref<const std::string&>(),
                                           static_cast<uint32_t>(rank), merge_where));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(merge_where, ": expected \"left right\" or [left, right]"));
    }
  }
  return model;
}

absl::Status BpeModel::AddMerge(std::string_view left, std::string_view right, uint32_t rank,
                                const std::string& where) {
  const auto left_id = TokenToId(left);
  const auto right_id = TokenToId(right);
  if (!left_id || !right_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": token '", std::string(left_id ? right : left), "' is not in the vocabulary"));
  }
  std::string merged(left);
  const std::string_view& prefix = continuing_subword_prefix_;
  merged.append(right.substr(right.compare(0, prefix.size(), prefix) == 0 ? prefix.size() : 0));
  const auto new_id = TokenToId(merged);
  if (!new_id) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": merged token '", merged, "' is not in the vocabulary"));
  }
  // A repeated pair keeps its last rank, as HF's map collection does.
  merges_[PairKey(*left_id, *right_id)] = MergeInfo{rank, *new_id};
  return absl::OkStatus();
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(AbslView(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::string_view BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= IdLimit()) return {};
  return id_to_token_[id];
}

const BpeModel::MergeInfo* BpeModel::FindMerge(int32_t left, int32_t right) const {
  auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

int32_t BpeModel::CharId(char32_t c, std::string_view utf8, bool first, bool last) const {
  const bool add_prefix = !first && !continuing_subword_prefix_.empty();
  const bool add_suffix = last && !end_of_word_suffix_.empty();
  if (!add_prefix && !add_suffix) {
    if (c < kCharTableSize) return char_ids_[c];
    return TokenToId(utf8).value_or(-1);
  }
  std::string key = absl::StrCat(add_prefix ? continuing_subword_prefix_ : "", std::string(utf8),
                                 add_suffix ? end_of_word_suffix_ : "");
  return TokenToId(key).value_or(-1);
}

void BpeModel::MergeWord(std::string_view word, std::vector<int32_t>* ids) const {
  thread_local MergeScratch scratch;
  std::vector<Symbol>& symbols = scratch.symbols;
  symbols.clear();

  // Bytes of the pending run of unknown characters (one unk symbol, or one
  // per character without fuse_unk); flushed before the next known symbol.
  int32_t unk_bytes = 0;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t start = pos;
    const char32_t c = NextChar(word, &pos);
    const std::string_view utf8 = word.substr(start, pos - start);
    const auto bytes = static_cast<int32_t>(utf8.size());
    const int32_t id = CharId(c, utf8, start == 0, pos == word.size());
    if (id >= 0) {
      if (unk_bytes > 0) AddSymbol(unk_id_, unk_bytes, &symbols);
      unk_bytes = 0;
      AddSymbol(id, bytes, &symbols);
      continue;
    }
    if (byte_fallback_) {
      // HF looks up the bytes of the piece including any prefix or suffix.
      const bool add_prefix = start != 0 && !continuing_subword_prefix_.empty();
      const bool add_suffix = pos == word.size() && !end_of_word_suffix_.empty();
      const std::string piece =
          absl::StrCat(add_prefix ? continuing_subword_prefix_ : "", std::string(utf8),
                       add_suffix ? end_of_word_suffix_ : "");
      const bool all_bytes = std::all_of(piece.begin(), piece.end(), [&](char b) {
        return byte_ids_[static_cast<unsigned char>(b)] >= 0;
      });
      if (all_bytes) {
        // HF leaves a pending unknown run pending here, to be flushed later.
        for (char b : piece) AddSymbol(byte_ids_[static_cast<unsigned char>(b)], 1, &symbols);
        continue;
      }
    }
    if (unk_id_ < 0) continue;  // no unk token: the character is dropped
    if (unk_bytes > 0 && !fuse_unk_) {
      AddSymbol(unk_id_, unk_bytes, &symbols);
      unk_bytes = 0;
    }
    unk_bytes += bytes;
  }
  if (unk_bytes > 0) AddSymbol(unk_id_, unk_bytes, &symbols);
  if (symbols.empty()) return;

  std::vector<uint64_t>& heap = scratch.heap;
  heap.clear();
  const auto push = [&heap](uint32_t rank, int32_t position) {
    heap.push_back((static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(position));
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const MergeInfo* m = FindMerge(symbols[i].id, symbols[i + 1].id)) {
      heap.push_back((static_cast<uint64_t>(m->rank) << 32) | i);
    }
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const uint64_t top = heap.back();
    heap.pop_back();
    const auto rank = static_cast<uint32_t>(top >> 32);
    const auto at = static_cast<int32_t>(top & 0xFFFFFFFFu);
    Symbol& left = symbols[at];
    if (left.bytes == 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // A stale entry: the pair at `at` changed since it was queued. (Symbols
    // only grow, so the same rank means the same pair.)
    const MergeInfo* m = FindMerge(left.id, right.id);
    if (m == nullptr || m->rank != rank) continue;
    left.id = m->new_id;
    left.bytes += right.bytes;
    right.bytes = 0;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = at;
    if (left.prev >= 0) {
      if (const MergeInfo* before = FindMerge(symbols[left.prev].id, left.id)) {
        push(before->rank, left.prev);
      }
    }
    if (left.next >= 0) {
      if (const MergeInfo* after = FindMerge(left.id, symbols[left.next].id)) {
        push(after->rank, at);
      }
    }
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = TokenToId(word)) {
      ids->push_back(*id);
      return;
    }
  }
  if (word.size() >= kMaxCachedBytes) {
    MergeWord(word, ids);
    return;
  }
  const absl::string_view key = AbslView(word);
  CacheShard& shard = cache_[absl::Hash<absl::string_view>()(key) % kCacheShards];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.words.find(key);
    if (it != shard.words.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids->size();
  MergeWord(word, ids);
  std::lock_guard<std::mutex> lock(shard.mu);
  // A full shard stops caching new words, as HF's cache does.
  if (shard.words.size() < kCacheWordsPerShard) {
    shard.words.emplace(std::string(word), std::vector<int32_t>(ids->begin() + first, ids->end()));
  }
}

}  // namespace lair::tok
