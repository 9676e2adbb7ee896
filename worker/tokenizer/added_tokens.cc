#include "worker/tokenizer/added_tokens.h"

#include <algorithm>

#include "worker/tokenizer/utf8.h"

namespace tandem::tokenizer {

AddedTokenMatcher::AddedTokenMatcher() : nodes_(1) { root_.fill(-1); }

void AddedTokenMatcher::Add(std::string_view text, int index) {
  if (text.empty()) return;
  int32_t node = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    int32_t child = -1;
    if (node == 0) {
      child = root_[b];
    } else {
      for (const auto& [byte, n] : nodes_[static_cast<size_t>(node)].children) {
        if (byte == b) child = n;
      }
    }
    if (child < 0) {
      child = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      if (node == 0) {
        root_[b] = child;
      } else {
        nodes_[static_cast<size_t>(node)].children.emplace_back(b, child);
      }
    }
    node = child;
  }
  if (nodes_[static_cast<size_t>(node)].token < 0) nodes_[static_cast<size_t>(node)].token = index;
}

int AddedTokenMatcher::LongestAt(std::string_view text, size_t pos, size_t* len) const {
  int32_t node = root_[static_cast<unsigned char>(text[pos])];
  int best = -1;
  size_t i = pos + 1;
  while (node >= 0) {
    const Node& n = nodes_[static_cast<size_t>(node)];
    if (n.token >= 0) {
      best = n.token;
      *len = i - pos;
    }
    if (i >= text.size()) break;
    const auto b = static_cast<unsigned char>(text[i]);
    int32_t next = -1;
    for (const auto& [byte, child] : n.children) {
      if (byte == b) next = child;
    }
    node = next;
    ++i;
  }
  return best;
}

void AddedTokenMatcher::Split(std::string_view text, const std::vector<AddedToken>& tokens,
                              absl::FunctionRef<void(size_t, size_t)> on_text,
                              absl::FunctionRef<void(int, size_t, size_t)> on_token) const {
  size_t start_offset = 0;  // end of the last token
  size_t pos = 0;
  if (!empty()) {
    while (pos < text.size()) {
      if (root_[static_cast<unsigned char>(text[pos])] < 0) {
        ++pos;
        continue;
      }
      size_t len = 0;
      const int index = LongestAt(text, pos, &len);
      if (index < 0) {
        ++pos;
        continue;
      }
      const AddedToken& tok = tokens[static_cast<size_t>(index)];
      size_t start = pos;
      size_t stop = pos + len;
      if (tok.lstrip) {
        // Whitespace taken by the previous token stays with it.
        const std::string_view before = text.substr(start_offset, start - start_offset);
        start -= TrailingWhiteSpace(before);
      }
      if (tok.rstrip) stop += LeadingWhiteSpace(text.substr(stop));
      if (start_offset < start) on_text(start_offset, start);
      on_token(index, start, stop);
      start_offset = stop;
      pos = stop;
    }
  }
  if (start_offset < text.size()) on_text(start_offset, text.size());
}

}  // namespace tandem::tokenizer
