// Text and JSON rendering for tandemctl: state names, durations, aligned
// tables, proto -> JSON (proto field names, defaults included), and the live
// progress line of a job (step/total, loss or reward, accuracy, KL,
// tokens/s, elapsed, ETA). Pure functions; thread safe.
#pragma once

#include <string>
#include <vector>

#include "google/protobuf/message.h"
#include "tandem/v1/control.pb.h"

namespace tandem::cli {

std::string StateName(tandem::v1::JobState s);           // "RUNNING"
std::string WorkerStateName(tandem::v1::WorkerState s);  // "IDLE"
std::string KindName(tandem::v1::JobKind k);             // "grpo"
bool IsTerminal(tandem::v1::JobState s);
// 0:07, 3:25, 1:02:03.
std::string FormatDuration(double seconds);
std::string FormatBytes(int64_t bytes);
// One JSON object on one line.
std::string ToJson(const google::protobuf::Message& m);
// Columns padded to the widest cell; first row is the header.
std::string Table(const std::vector<std::vector<std::string>>& rows);
// "step 12/200  loss 1.2345  acc 0.750  kl 0.0012  1234 tok/s  elapsed 0:12  eta 3:10".
// now: unix seconds; job.started_at is the start of elapsed.
std::string ProgressLine(const tandem::v1::Job& job, const tandem::v1::StepMetrics& m, double now);
double NowUnix();

}  // namespace tandem::cli
