#include "worker/tokenizer/tokenize_command.h"

#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>

#include "nlohmann/json.hpp"
#include "worker/tokenizer/hf_tokenizer.h"
#include "worker/tokenizer/utf8.h"

namespace tandem::tokenizer {

namespace {

constexpr int kOk = 0;
constexpr int kRuntime = 1;
constexpr int kUsage = 2;

constexpr char kHelp[] =
    "usage: tandemctl tokenize --tokenizer DIR (--text TEXT | --text-file FILE) [--decode]\n"
    "           [--output text|json]\n"
    "  Encodes text with the Hugging Face tokenizer in DIR (tokenizer.json and, when\n"
    "  present, tokenizer_config.json), adding what its post-processor adds (e.g. BOS).\n"
    "  --tokenizer DIR    directory holding tokenizer.json\n"
    "  --text TEXT        the input\n"
    "  --text-file FILE   read the input from FILE, byte for byte (- for stdin)\n"
    "  --decode           the input is token ids (separated by spaces or commas, or a JSON\n"
    "                     list); prints their text exactly, with no newline added\n"
    "  --output FORMAT    text (default): ids separated by spaces; json: {\"ids\": [...]}\n"
    "                     (with --decode: {\"text\": \"...\"})\n";

int Usage(const std::string& msg) {
  std::cerr << "tokenize: " << msg << "\n" << kHelp;
  return kUsage;
}

int Invalid(const std::string& msg) {
  std::cerr << "tokenize: " << msg << "\n";
  return kUsage;
}

// Parses "1 2,3" or "[1, 2, 3]" into ids; nullopt and *error on failure.
std::optional<std::vector<int64_t>> ParseIds(const std::string& text, std::string* error) {
  std::vector<int64_t> ids;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_array()) {
      *error = "the input starts with '[' but is not a JSON list";
      return std::nullopt;
    }
    for (const auto& v : j) {
      if (!v.is_number_integer()) {
        *error = "the JSON list holds " + v.dump() + ", not an integer";
        return std::nullopt;
      }
      ids.push_back(v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX ? INT64_MAX : v.get<int64_t>());
    }
    return ids;
  }
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && text[j] != ' ' && text[j] != '\t' && text[j] != '\n' && text[j] != '\r' &&
           text[j] != ',') {
      ++j;
    }
    const std::string word = text.substr(i, j - i);
    int64_t v = 0;
    const auto [p, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
    if (ec != std::errc() || p != word.data() + word.size()) {
      *error = "\"" + word + "\" is not a token id";
      return std::nullopt;
    }
    ids.push_back(v);
    i = j;
  }
  return ids;
}

}  // namespace

int TokenizeCommand(const std::vector<std::string>& args) {
  std::map<std::string, std::string> values;
  bool decode = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::cout << kHelp;
      return kOk;
    }
    if (a == "--decode") {
      decode = true;
      continue;
    }
    std::string name = a, value;
    bool has_value = false;
    if (const size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      has_value = true;
    }
    // tandemctl's connection flags apply to every command; tokenize ignores them.
    static const char* kKnown[] = {"--tokenizer",  "--text",   "--text-file", "--output", "--coordinator",
                                   "--token-file", "--tls-ca", "--tls-cert",  "--tls-key"};
    bool known = false;
    for (const char* k : kKnown) known = known || name == k;
    if (!known) {
      return Usage(a.rfind("--", 0) == 0 ? "unknown flag '" + name + "'" : "unexpected argument '" + a + "'");
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return Usage(name + " needs a value");
      value = args[++i];
    }
    values[name] = value;
  }
  if (!values.count("--tokenizer")) return Usage("--tokenizer is required");
  if (values.count("--text") == values.count("--text-file")) {
    return Usage("give exactly one of --text and --text-file");
  }
  const std::string output = values.count("--output") ? values["--output"] : "text";
  if (output != "text" && output != "json") {
    return Usage("--output must be text or json, not '" + output + "'");
  }

  std::string input;
  if (values.count("--text")) {
    input = values["--text"];
  } else {
    const std::string& path = values["--text-file"];
    if (path == "-") {
      input.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    } else {
      std::ifstream in(path, std::ios::binary);
      if (!in) return Invalid("cannot read --text-file " + path);
      std::ostringstream ss;
      ss << in.rdbuf();
      input = ss.str();
    }
  }

  auto tok = HfTokenizer::LoadDir(values["--tokenizer"]);
  if (!tok.ok()) {
    std::cerr << "tokenize: " << tok.status().message() << "\n";
    return kRuntime;
  }

  if (decode) {
    std::string error;
    const auto parsed = ParseIds(input, &error);
    if (!parsed) return Invalid(error);
    std::vector<int32_t> ids;
    for (int64_t id : *parsed) {
      if (id < 0 || id > INT32_MAX || !tok->IsKnownId(static_cast<int32_t>(id))) {
        return Invalid("id " + std::to_string(id) + " is not a token of this tokenizer (ids are 0.." +
                       std::to_string(tok->vocab_size() - 1) + ")");
      }
      ids.push_back(static_cast<int32_t>(id));
    }
    const std::string text = tok->Decode(ids);
    if (output == "json") {
      std::cout << nlohmann::json{{"text", text}}.dump() << "\n";
    } else {
      std::cout << text;
    }
    std::cout.flush();
    return kOk;
  }

  if (const size_t valid = ValidUtf8Prefix(input); valid != input.size()) {
    return Invalid("the text is not valid UTF-8 (at byte " + std::to_string(valid) + ")");
  }
  const std::vector<int32_t> ids = tok->Encode(input);
  if (output == "json") {
    std::cout << nlohmann::json{{"ids", ids}}.dump() << "\n";
  } else {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) line += ' ';
      line += std::to_string(ids[i]);
    }
    std::cout << line << "\n";
  }
  std::cout.flush();
  return kOk;
}

}  // namespace tandem::tokenizer
