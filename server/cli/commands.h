// tandemctl commands. Each takes the arguments after its command word(s),
// parses them (printing its own --help), and returns an exit code from
// exit_codes.h. They write results to stdout and diagnostics to stderr.
#pragma once

#include <string>
#include <vector>

namespace tandem::cli {

using Args = std::vector<std::string>;

int CmdSubmit(const Args& args);        // submit JOB.yaml [--set k=v] [--workers N] [--resume-from P]
int CmdValidate(const Args& args);      // validate JOB.yaml [--set k=v] [--workers N]
int CmdPlan(const Args& args);          // plan JOB.yaml --topology TOPO.yaml [--set k=v] [--json]
int CmdJobs(const Args& args);          // jobs [--state S] [--limit N]
int CmdStatus(const Args& args);        // status JOB
int CmdCancel(const Args& args);        // cancel JOB [--reason TEXT]
int CmdCheckpoints(const Args& args);   // checkpoints JOB
int CmdWatch(const Args& args);         // watch JOB
int CmdLogs(const Args& args);          // logs JOB [-f]
int CmdEvents(const Args& args);        // events JOB
int CmdWorkers(const Args& args);       // workers
int CmdDrain(const Args& args);         // drain WORKER
int CmdRunLocal(const Args& args);      // run --local [--workers N] [--run-dir DIR] JOB.yaml [--set k=v]
int CmdChatTemplate(const Args& args);  // chat-template --tokenizer DIR --messages-file F [--add-generation-prompt]

}  // namespace tandem::cli
