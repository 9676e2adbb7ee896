// PHASE_EXPORT: the final model as Hugging Face safetensors + config.json
// (+ tokenizer.json), written by rank 0 after every rank took part in
// gathering the full parameters.
#include <filesystem>

#include "worker/engine/phases.h"
#include "worker/model/file_util.h"
#include "worker/model/safetensors.h"

namespace tandem::worker {

absl::Status ExportModel(JobContext& ctx, ReportPhaseRequest* report) {
  std::vector<float> full(ctx.model->layout().total_floats());
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
    // files (and the model's generation_config.json) are copied, so the
    // directory loads back with its tokenizer and chat template.
    const bool is_char = ctx.tokenizer && ctx.tokenizer->kind() == "char";
    const model::CharTokenizer char_tok = model::CharTokenizer::Default();
    absl::Status st = model::SaveModelDir(dir, ctx.config, full.data(), is_char ? &char_tok : nullptr);
    if (st.ok() && ctx.tokenizer && !is_char) st = ctx.tokenizer->SaveTo(dir);
    const std::string from = ctx.spec().model().from();
    std::error_code ec;
    if (st.ok() && !from.empty() && std::filesystem::exists(from + "/generation_config.json", ec)) {
      auto text = model::ReadFileToString(from + "/generation_config.json");
      st = text.ok() ? model::WriteFileAtomic(dir + "/generation_config.json", *text) : text.status();
    }
    if (!st.ok()) return absl::Status(st.code(), "export to " + dir + ": " + std::string(st.message()));
    report->add_log_lines("exported the model to " + dir);
    (*report->mutable_values())["exported"] = 1;
  }
  return ctx.collective->barrier(ctx.timeout);
}

}  // namespace tandem::worker
