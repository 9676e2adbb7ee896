// tandem-config-doc [--check] FILE...: regenerates the configuration
// tables in Markdown files from the config tables (config_doc.h).
// --check changes nothing and exits 1 when a file is out of date.
// Exit codes: 0 up to date (or rewritten), 1 out of date (--check), 2 error.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/config_doc.h"

int main(int argc, char** argv) {
  bool check = false;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--check") {
      check = true;
    } else if (a == "--help" || a == "-h") {
      std::cout << "usage: tandem-config-doc [--check] FILE...\n"
                   "Regenerates the <!-- config-table TABLE SECTION --> blocks of Markdown files.\n";
      return 0;
    } else {
      files.push_back(a);
    }
  }
  if (files.empty()) {
    std::cerr << "tandem-config-doc: no files (see --help)\n";
    return 2;
  }
  int rc = 0;
  for (const std::string& file : files) {
    std::ifstream in(file);
    if (!in) {
      std::cerr << "tandem-config-doc: " << file << ": cannot open file\n";
      return 2;
    }
    std::stringstream text;
    text << in.rdbuf();
    auto rendered = tandem::common::RenderConfigDoc(text.str());
    if (!rendered.ok()) {
      std::cerr << "tandem-config-doc: " << file << ": " << rendered.status().message() << "\n";
      return 2;
    }
    if (*rendered == text.str()) continue;
    if (check) {
      std::cerr << "tandem-config-doc: " << file << " is out of date\n";
      rc = 1;
      continue;
    }
    std::ofstream(file) << *rendered;
    std::cout << "tandem-config-doc: rewrote " << file << "\n";
  }
  return rc;
}
