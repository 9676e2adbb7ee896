#include "worker/tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/tokenizer/json_fields.h"
#include "worker/tokenizer/utf8.h"

namespace tandem::tokenizer {

namespace {

// Heap order: lowest rank first, then leftmost.
struct MergeLess {
  template <typename M>
  bool operator()(const M& a, const M& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const Json& j, const std::string& path) {
  RETURN_IF_ERROR(CheckFields(j, path,
                              {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                               "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"}));
  std::unique_ptr<BpeModel> m(new BpeModel());
  if (const Json* d = FindField(j, "dropout"); d != nullptr && !d->is_null()) {
    if (!d->is_number()) return JsonTypeError(JsonPath(path, "dropout"), "a number or null", *d);
    if (d->get<double>() != 0.0) {
      return absl::InvalidArgumentError(absl::StrCat(JsonPath(path, "dropout"), " ", d->dump(),
                                                     " is not supported (only null or 0: encoding is deterministic)"));
    }
  }
  ASSIGN_OR_RETURN(m->fuse_unk_, ReadBool(j, path, "fuse_unk", false));
  ASSIGN_OR_RETURN(m->byte_fallback_, ReadBool(j, path, "byte_fallback", false));
  ASSIGN_OR_RETURN(m->ignore_merges_, ReadBool(j, path, "ignore_merges", false));
  ASSIGN_OR_RETURN(std::optional<std::string> prefix, ReadOptionalString(j, path, "continuing_subword_prefix"));
  ASSIGN_OR_RETURN(std::optional<std::string> suffix, ReadOptionalString(j, path, "end_of_word_suffix"));
  m->continuing_subword_prefix_ = prefix.value_or("");
  m->end_of_word_suffix_ = suffix.value_or("");

  // Vocabulary.
  const std::string vocab_path = JsonPath(path, "vocab");
  const Json* vocab = FindField(j, "vocab");
  if (vocab == nullptr) return absl::InvalidArgumentError(vocab_path + " is missing");
  if (!vocab->is_object()) return JsonTypeError(vocab_path, "an object", *vocab);
  int64_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const std::string entry = absl::StrCat(vocab_path, "[", Quote(it.key()), "]");
    if (it.key().empty()) return absl::InvalidArgumentError(vocab_path + ": a token is empty");
    ASSIGN_OR_RETURN(const int64_t id, ReadIntValue(it.value(), entry, 0, kMaxTokenId));
    max_id = std::max(max_id, id);
  }
  if (max_id + 1 - static_cast<int64_t>(vocab->size()) > kMaxUnusedIds) {
    return absl::InvalidArgumentError(absl::StrCat(vocab_path, ": ids go up to ", max_id, " but there are only ",
                                                   vocab->size(), " tokens (at most ", kMaxUnusedIds,
                                                   " unused ids are accepted)"));
  }
  m->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const auto id = static_cast<size_t>(it.value().get<int64_t>());
    std::string& slot = m->id_to_token_[id];
    if (!slot.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(vocab_path, ": ", Quote(slot), " and ", Quote(it.key()), " both have id ", id));
    }
    slot = it.key();
  }
  m->vocab_.reserve(vocab->size());
  for (size_t id = 0; id < m->id_to_token_.size(); ++id) {
    if (!m->id_to_token_[id].empty()) m->vocab_.emplace(m->id_to_token_[id], static_cast<int32_t>(id));
  }
  std::fill(std::begin(m->ascii_ids_), std::end(m->ascii_ids_), -1);
  for (int c = 0; c < 128; ++c) {
    const char ch = static_cast<char>(c);
    if (auto id = m->TokenToId(std::string_view(&ch, 1))) m->ascii_ids_[c] = *id;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    m->byte_fallback_ids_[b] = m->TokenToId(name).value_or(-1);
  }

  ASSIGN_OR_RETURN(std::optional<std::string> unk, ReadOptionalString(j, path, "unk_token"));
  if (unk.has_value()) {
    m->unk_id_ = m->TokenToId(*unk);
    if (!m->unk_id_) {
      return absl::InvalidArgumentError(
          absl::StrCat(JsonPath(path, "unk_token"), " ", Quote(*unk), " is not in ", vocab_path));
    }
  }

  // Merges.
  const std::string merges_path = JsonPath(path, "merges");
  const Json* merges = FindField(j, "merges");
  if (merges == nullptr) return absl::InvalidArgumentError(merges_path + " is missing");
  if (!merges->is_array()) return JsonTypeError(merges_path, "an array", *merges);
  m->merges_.reserve(merges->size());
  const size_t prefix_len = m->continuing_subword_prefix_.size();
  int32_t rank = 0;
  std::string a, b;
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& e = (*merges)[i];
    const std::string entry = JsonPath(merges_path, i);
    if (e.is_string()) {
      const std::string& line = e.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(entry, ": ", Quote(line), " is not two tokens separated by one space"));
      }
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(entry, ": expected \"a b\" or [\"a\", \"b\"], got ", JsonTypeName(e)));
    }
    const auto a_id = m->TokenToId(a);
    const auto b_id = m->TokenToId(b);
    if (!a_id || !b_id) {
      return absl::InvalidArgumentError(absl::StrCat(entry, ": ", Quote(a_id ? b : a), " is not in ", vocab_path));
    }
    if (b.size() < prefix_len) {
      return absl::InvalidArgumentError(
          absl::StrCat(entry, ": ", Quote(b), " is shorter than continuing_subword_prefix"));
    }
    const std::string merged = a + b.substr(prefix_len);
    const auto new_id = m->TokenToId(merged);
    if (!new_id) {
      return absl::InvalidArgumentError(
          absl::StrCat(entry, ": the merged token ", Quote(merged), " is not in ", vocab_path));
    }
    // A repeated pair takes its last rank, as in Hugging Face tokenizers.
    m->merges_[PairKey(*a_id, *b_id)] = MergeInfo{rank, *new_id};
    ++rank;
  }
  return m;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
  const std::string& s = id_to_token_[static_cast<size_t>(id)];
  return s.empty() ? nullptr : &s;
}

const BpeModel::MergeInfo* BpeModel::FindMerge(int32_t a, int32_t b) const {
  auto it = merges_.find(PairKey(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

std::optional<int32_t> BpeModel::CharId(std::string_view ch) const {
  if (ch.size() == 1) {
    const auto c = static_cast<unsigned char>(ch[0]);
    if (c < 0x80) return ascii_ids_[c] >= 0 ? std::optional<int32_t>(ascii_ids_[c]) : std::nullopt;
  }
  return TokenToId(ch);
}

void BpeModel::InitialSymbols(std::string_view word, Scratch* s) const {
  std::vector<Symbol>& syms = s->symbols;
  syms.clear();
  auto add = [&syms](int32_t id, int32_t len) {
    const auto n = static_cast<int32_t>(syms.size());
    syms.push_back(Symbol{id, n - 1, n + 1, len});
  };
  const bool affixes = !continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty();
  bool have_unk = false;
  int32_t unk_len = 0;
  size_t i = 0;
  while (i < word.size()) {
    const int len = Utf8LeadLength(static_cast<unsigned char>(word[i]));
    const std::string_view ch = word.substr(i, static_cast<size_t>(len));
    const bool is_first = i == 0;
    i += static_cast<size_t>(len);
    const bool is_last = i >= word.size();
    std::string_view symbol = ch;
    if (affixes) {
      s->piece.clear();
      if (!is_first) s->piece.append(continuing_subword_prefix_);
      s->piece.append(ch);
      if (is_last) s->piece.append(end_of_word_suffix_);
      symbol = s->piece;
    }
    const std::optional<int32_t> id = affixes ? TokenToId(symbol) : CharId(symbol);
    if (id) {
      if (have_unk) {
        add(*unk_id_, unk_len);
        have_unk = false;
      }
      add(*id, len);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : symbol) all = all && byte_fallback_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : symbol) add(byte_fallback_ids_[static_cast<unsigned char>(c)], 1);
        continue;
      }
    }
    if (unk_id_) {
      if (have_unk && fuse_unk_) {
        unk_len += len;
      } else {
        if (have_unk) add(*unk_id_, unk_len);
        have_unk = true;
        unk_len = len;
      }
    }
  }
  if (have_unk) add(*unk_id_, unk_len);
  if (!syms.empty()) syms.back().next = -1;
}

void BpeModel::MergeAll(Scratch* s) const {
  std::vector<Symbol>& sym = s->symbols;
  std::vector<QueuedMerge>& heap = s->heap;
  heap.clear();
  for (size_t i = 0; i + 1 < sym.size(); ++i) {
    if (const MergeInfo* m = FindMerge(sym[i].id, sym[i + 1].id)) {
      heap.push_back({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  std::make_heap(heap.begin(), heap.end(), MergeLess());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), MergeLess());
    const QueuedMerge top = heap.back();
    heap.pop_back();
    Symbol& cur = sym[static_cast<size_t>(top.pos)];
    if (cur.len == 0 || cur.next < 0) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = sym[static_cast<size_t>(next_pos)];
    // A stale entry: the pair at pos no longer makes this token.
    const MergeInfo* now = FindMerge(cur.id, right.id);
    if (now == nullptr || now->new_id != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    sym[static_cast<size_t>(next_pos)].len = 0;
    if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (const MergeInfo* m = FindMerge(sym[static_cast<size_t>(cur.prev)].id, cur.id)) {
        heap.push_back({m->rank, cur.prev, m->new_id});
        std::push_heap(heap.begin(), heap.end(), MergeLess());
      }
    }
    if (cur.next >= 0) {
      if (const MergeInfo* m = FindMerge(cur.id, sym[static_cast<size_t>(cur.next)].id)) {
        heap.push_back({m->rank, top.pos, m->new_id});
        std::push_heap(heap.begin(), heap.end(), MergeLess());
      }
    }
  }
}

void BpeModel::Encode(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = TokenToId(word)) {
      ids->push_back(*id);
      return;
    }
  }
  if (cache_.Lookup(word, ids)) return;
  thread_local Scratch scratch;
  InitialSymbols(word, &scratch);
  MergeAll(&scratch);
  const size_t before = ids->size();
  for (const Symbol& s : scratch.symbols) {
    if (s.len > 0) ids->push_back(s.id);
  }
  cache_.Insert(word, std::span<const int32_t>(ids->data() + before, ids->size() - before));
}

}  // namespace tandem::tokenizer
