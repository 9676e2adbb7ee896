// `tandemctl tokenize`: encode text with a Hugging Face tokenizer directory,
// or decode ids back to text (no daemon involved).
//   tandemctl tokenize --tokenizer DIR (--text TEXT | --text-file FILE) [--decode]
//       [--output text|json]
// `args` are the words after "tokenize". Returns the exit code: 0 ok, 1 the
// tokenizer cannot be loaded, 2 usage error or invalid input. Results go to
// stdout, messages to stderr.
#pragma once

#include <string>
#include <vector>

namespace tandem::tokenizer {

int TokenizeCommand(const std::vector<std::string>& args);

}  // namespace tandem::tokenizer
