// Fuzz target: a Hugging Face tokenizer directory (worker/tokenizer), as
// every job with model.tokenizer reads it. Input: tokenizer.json, then
// optionally NUL and tokenizer_config.json, then optionally NUL and a text
// to encode. The files are written to a scratch directory and loaded with
// HfTokenizer::LoadDir. A tokenizer that loads must encode that text and a
// few fixed ones, decode every id it gives (and ids it never gives:
// negative, past the vocabulary) whole and through the StreamingDecoder,
// and answer every token and id lookup, without crashing.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "tests/fuzz/fuzz_util.h"
#include "worker/tokenizer/hf_tokenizer.h"
#include "worker/tokenizer/streaming_decoder.h"

namespace {

void Exercise(const tandem::tokenizer::HfTokenizer& tok, const std::string& text) {
  using tandem::tokenizer::StreamingDecoder;
  for (bool special : {true, false}) {
    std::vector<int32_t> ids = tok.Encode(text, special);
    for (int32_t id : ids) {
      if (!tok.IsKnownId(id)) tandem::fuzz::Fail("Encode gave an id no token has");
      (void)tok.IdToToken(id);
    }
    ids.insert(ids.end(), {-1, tok.vocab_size(), tok.vocab_size() + 7, INT32_MAX, INT32_MIN});
    for (bool skip : {false, true}) {
      (void)tok.Decode(ids, skip);
      StreamingDecoder stream(tok, skip);
      for (int32_t id : ids) (void)stream.Add(id);
      (void)stream.Flush();
    }
  }
  (void)tok.TokenToId(text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  const std::vector<std::string> parts =
      absl::StrSplit(absl::string_view(reinterpret_cast<const char*>(data), size), absl::MaxSplits('\0', 2));
  const std::string& dir = tandem::fuzz::ScratchDir("tokenizer_json");
  tandem::fuzz::WriteFileOrDie(dir + "/tokenizer.json", parts[0]);
  std::error_code ec;
  if (parts.size() > 1) {
    tandem::fuzz::WriteFileOrDie(dir + "/tokenizer_config.json", parts[1]);
  } else {
    fs::remove(dir + "/tokenizer_config.json", ec);
  }
  auto tok = tandem::tokenizer::HfTokenizer::LoadDir(dir);
  if (!tok.ok()) return 0;
  (void)tok->bos_id();
  (void)tok->eos_id();
  (void)tok->pad_id();
  (void)tok->unk_id();
  for (int32_t id : {-1, 0, 1, tok->vocab_size() - 1, tok->vocab_size()}) {
    (void)tok->IsSpecial(id);
    (void)tok->IdToToken(id);
  }
  Exercise(*tok, "Hello, world! It's 2024 -- caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac  \n\ttabs   spaces");
  Exercise(*tok, std::string("bad utf-8: \xff\xc3(\xe2\x82 end"));
  if (parts.size() > 2) Exercise(*tok, parts[2]);
  return 0;
}
