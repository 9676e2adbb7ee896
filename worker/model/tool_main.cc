// tandem-model-tool: a small stand-alone front end for the model commands
// (the same code tandemctl dispatches to):
//   tandem-model-tool model init ...   |   tandem-model-tool generate ...
#include <iostream>
#include <string>
#include <vector>

#include "worker/model/model_commands.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const char* usage = "usage: tandem-model-tool model init --help | tandem-model-tool generate --help\n";
  if (args.size() >= 2 && args[0] == "model" && args[1] == "init") {
    return tandem::model::ModelInitCommand({args.begin() + 2, args.end()});
  }
  if (!args.empty() && args[0] == "generate") {
    return tandem::model::GenerateCommand({args.begin() + 1, args.end()});
  }
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::cout << usage;
    return 0;
  }
  std::cerr << usage;
  return 2;
}
