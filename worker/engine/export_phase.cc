// PHASE_EXPORT: the final model as a Hugging Face model directory
// (safetensors, sharded above 5 GB, + config.json + generation_config.json
// + the tokenizer files of the source directory when the job's model came
// from one, else the char tokenizer's tokenizer.json), written by rank 0
// after every rank took part in gathering the full parameters.
#include <filesystem>

#include "worker/engine/phases.h"
#include "worker/model/file_util.h"
#include "worker/model/safetensors.h"

namespace tandem::worker {

absl::Status ExportModel(JobContext& ctx, ReportPhaseRequest* report) {
  std::vector<float> full(ctx.model->layout().total_floats());
  if (absl::Status st = ctx.zero->SyncHostUpdates(); !st.ok()) return st;
  if (absl::Status st = ctx.zero->GatherFull(full.data()); !st.ok()) return st;
  std::string dir = ctx.spec().output_dir();
  if (dir.empty() && !ctx.assignment.run_dir().empty()) {
    dir = ctx.assignment.run_dir() + "/final";
  }
  if (dir.empty()) {
    report->add_log_lines("export skipped: no output_dir in the job spec");
    return absl::OkStatus();
  }
  if (ctx.rank == 0) {
    // The char tokenizer is written with the weights; a Hugging Face one's
    // files, the model's generation_config.json and the rest of a source
    // directory's tokenizer files are copied (SaveOptions::source_dir), so
    // the directory loads back with its tokenizer and chat template.
    const bool is_char = ctx.tokenizer && ctx.tokenizer->kind() == "char";
    const model::CharTokenizer char_tok = model::CharTokenizer::Default();
    model::SaveOptions save;
    save.source_dir = ctx.spec().model().from();
    absl::Status st = model::SaveModelDir(dir, ctx.config, full.data(), is_char ? &char_tok : nullptr, save);
    if (st.ok() && ctx.tokenizer && !is_char) st = ctx.tokenizer->SaveTo(dir);
    if (!st.ok()) return absl::Status(st.code(), "export to " + dir + ": " + std::string(st.message()));
    report->add_log_lines("exported the model to " + dir);
    (*report->mutable_values())["exported"] = 1;
  }
  return ctx.collective->barrier(ctx.timeout);
}

}  // namespace tandem::worker
