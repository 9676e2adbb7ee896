// tandemctl: the Tandem command-line client. Parses the command word and
// hands the rest to the command (commands.h); `model init` and `generate`
// go to the model tools (worker/model/model_commands.h), `tokenize` to the
// tokenizer (worker/tokenizer/tokenize_command.h).
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "server/cli/commands.h"
#include "server/cli/exit_codes.h"
#include "worker/model/model_commands.h"
#include "worker/tokenizer/tokenize_command.h"

namespace {

constexpr char kUsage[] =
    "Usage: tandemctl COMMAND [ARGS] [--coordinator HOST:PORT] [--token-file PATH] [--tls-ca PATH] [--tls-cert PATH "
    "--tls-key PATH]\n"
    "                 [--output text|json]\n"
    "\n"
    "Jobs:\n"
    "  submit JOB.yaml [--set k=v ...] [--workers N] [--resume-from PATH]   submit a job; prints its id\n"
    "  validate JOB.yaml [--set k=v ...]       check a job file (no coordinator needed)\n"
    "  plan JOB.yaml --topology TOPO.yaml      bytes per network tier, memory per rank and\n"
    "                                          communication time of one step (no coordinator needed)\n"
    "  jobs [--state S] [--limit N]            list jobs\n"
    "  status JOB                              state, progress, latest metrics\n"
    "  watch JOB                               live progress; exits with the job's outcome\n"
    "  logs JOB [-f]                           job log lines (coordinator and workers)\n"
    "  events JOB                              every recorded event of a job, oldest first\n"
    "  cancel JOB                              cancel a job\n"
    "  checkpoints JOB                         checkpoints of a job\n"
    "Cluster:\n"
    "  workers                                 registered workers and their state\n"
    "  drain WORKER                            finish the current job, then take no more\n"
    "Local:\n"
    "  run --local [--workers N] [--run-dir DIR] [--worker-device cpu-guarded] JOB.yaml [--set k=v ...]\n"
    "                                          coordinator + N workers on this machine, one job\n"
    "Models:\n"
    "  model init --config MODEL.yaml --seed S --out DIR    write a randomly initialized model\n"
    "  generate --model DIR --prompt TEXT [...]              sample from a model\n"
    "  chat-template --tokenizer DIR --messages-file F [--add-generation-prompt]\n"
    "                                          render a conversation with the model's chat template\n"
    "  tokenize --tokenizer DIR (--text TEXT | --text-file F) [--decode]\n"
    "                                          token ids of a text with a Hugging Face tokenizer\n"
    "\n"
    "Environment: TANDEM_COORDINATOR, TANDEM_ADMIN_TOKEN, TANDEM_TLS_CA.\n"
    "Exit codes: 0 ok, 1 job failed / error, 2 usage or invalid input, 3 cancelled,\n"
    "            4 cannot reach the coordinator, 5 authentication.\n"
    "`tandemctl COMMAND --help` describes each command.\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kUsage;
    return args.empty() ? tandem::cli::kExitUsage : tandem::cli::kExitOk;
  }
  if (args[0] == "--version" || args[0] == "version") {
    std::cout << "tandemctl " << TANDEM_VERSION << "\n";
    return 0;
  }
  // Global flags may come before the command: move them after it.
  std::vector<std::string> globals;
  size_t i = 0;
  while (i < args.size() && args[i].rfind("--", 0) == 0 && args[i] != "--") {
    const std::string& a = args[i];
    const bool takes_value = a == "--coordinator" || a == "--token-file" || a == "--tls-ca" || a == "--tls-cert" ||
                             a == "--tls-key" || a == "--output";
    globals.push_back(a);
    if (takes_value && i + 1 < args.size()) globals.push_back(args[++i]);
    ++i;
  }
  if (i >= args.size()) {
    std::cerr << "tandemctl: no command given\n\n" << kUsage;
    return tandem::cli::kExitUsage;
  }
  const std::string cmd = args[i];
  std::vector<std::string> rest(args.begin() + i + 1, args.end());
  // Before any "--" so they stay flags.
  auto dashdash = std::find(rest.begin(), rest.end(), "--");
  rest.insert(dashdash, globals.begin(), globals.end());
  using namespace tandem::cli;
  if (cmd == "submit") return CmdSubmit(rest);
  if (cmd == "validate") return CmdValidate(rest);
  if (cmd == "plan") return CmdPlan(rest);
  if (cmd == "jobs") return CmdJobs(rest);
  if (cmd == "status") return CmdStatus(rest);
  if (cmd == "watch") return CmdWatch(rest);
  if (cmd == "logs") return CmdLogs(rest);
  if (cmd == "events") return CmdEvents(rest);
  if (cmd == "cancel") return CmdCancel(rest);
  if (cmd == "checkpoints") return CmdCheckpoints(rest);
  if (cmd == "workers") return CmdWorkers(rest);
  if (cmd == "drain") return CmdDrain(rest);
  if (cmd == "run") return CmdRunLocal(rest);
  if (cmd == "generate") return tandem::model::GenerateCommand(rest);
  if (cmd == "chat-template") return CmdChatTemplate(rest);
  if (cmd == "tokenize") return tandem::tokenizer::TokenizeCommand(rest);
  if (cmd == "model") {
    if (!rest.empty() && rest[0] == "init") {
      return tandem::model::ModelInitCommand(std::vector<std::string>(rest.begin() + 1, rest.end()));
    }
    std::cerr << "tandemctl: model: expected `model init ...`\n";
    return kExitUsage;
  }
  std::cerr << "tandemctl: unknown command '" << cmd << "'\n\n" << kUsage;
  return kExitUsage;
}
