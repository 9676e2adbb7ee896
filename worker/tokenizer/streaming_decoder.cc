#include "worker/tokenizer/streaming_decoder.h"

#include <span>
#include <string_view>

#include "worker/tokenizer/utf8.h"

namespace tandem::tokenizer {

namespace {

// The window is cut back to its last kContext ids once it holds more than
// kMaxWindow and all of its text has been passed on. The context keeps
// decoders that treat the first token specially (Metaspace, Strip) from
// seeing a later token as the first.
constexpr size_t kMaxWindow = 16;
constexpr size_t kContext = 4;

// Characters that clean-up patterns (" .", " n't", " 're", ...) are made of.
bool IsCleanUpChar(char c) {
  switch (c) {
    case ' ':
    case '.':
    case '?':
    case '!':
    case ',':
    case '\'':
    case 'n':
    case 't':
    case 'm':
    case 's':
    case 'v':
    case 'e':
    case 'r':
      return true;
    default:
      return false;
  }
}

// Length of the prefix of s that clean-up can no longer change whatever
// follows: every pattern starts with a space and holds only clean-up
// characters, so text before the first space of the trailing run of
// clean-up characters is final.
size_t CleanUpSafePrefix(std::string_view s) {
  size_t run = s.size();
  while (run > 0 && IsCleanUpChar(s[run - 1])) --run;
  const size_t space = s.find(' ', run);
  return space == std::string_view::npos ? s.size() : space;
}

}  // namespace

StreamingDecoder::StreamingDecoder(const HfTokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamingDecoder::Add(int32_t id) {
  // Ids Decode would skip change nothing.
  if (!tokenizer_->IsKnownId(id)) return "";
  if (skip_special_tokens_ && tokenizer_->IsSpecial(id)) return "";
  window_.push_back(id);

  // A trailing run of byte tokens decodes differently once it ends.
  size_t ready = window_.size();
  if (tokenizer_->decoder_has_byte_fallback()) {
    while (ready > 0 && tokenizer_->IsByteFallbackToken(window_[ready - 1])) --ready;
  }
  if (ready == 0) return "";
  const std::string text = tokenizer_->DecodeRaw(std::span<const int32_t>(window_.data(), ready), false);
  // A trailing U+FFFD may be an incomplete character.
  size_t stable = text.size();
  while (stable >= kReplacementChar.size() &&
         std::string_view(text).substr(stable - kReplacementChar.size()) == kReplacementChar) {
    stable -= kReplacementChar.size();
  }
  std::string out;
  if (stable > emitted_) {
    out = text.substr(emitted_, stable - emitted_);
    emitted_ = stable;
  }
  if (ready == window_.size() && stable == text.size() && window_.size() > kMaxWindow) {
    window_.erase(window_.begin(), window_.end() - kContext);
    emitted_ = tokenizer_->DecodeRaw(window_, false).size();
  }
  return CleanUp(std::move(out), false);
}

std::string StreamingDecoder::Flush() {
  std::string out;
  if (!window_.empty()) {
    const std::string text = tokenizer_->DecodeRaw(window_, false);
    if (text.size() > emitted_) out = text.substr(emitted_);
  }
  out = CleanUp(std::move(out), true);
  window_.clear();
  emitted_ = 0;
  pending_.clear();
  return out;
}

std::string StreamingDecoder::CleanUp(std::string raw, bool final) {
  if (!tokenizer_->clean_up_spaces()) return raw;
  pending_.append(raw);
  const size_t cut = final ? pending_.size() : CleanUpSafePrefix(pending_);
  std::string out = CleanUpTokenizationSpaces(std::string_view(pending_).substr(0, cut));
  pending_.erase(0, cut);
  return out;
}

}  // namespace tandem::tokenizer
