// ZenFlow: row selection, the device/host split of the AdamW update, and
// the hand-over to the host thread (see zenflow.h).
#include "worker/zero/zenflow.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::zero {

namespace {

template <typename R>
bool Adjacent(const R& a, size_t opt, size_t param) {
  return a.opt + a.len == opt && a.param + a.len == param;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ZenFlow>> ZenFlow::Create(const ZenFlowOptions& options, const ZenFlowAdamW& adamw,
                                                         std::vector<ZenFlowSegment> segments, size_t opt_size) {
  if (!(options.topk_fraction > 0 && options.topk_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("zenflow: topk_fraction must be in (0, 1], got ", options.topk_fraction));
  }
  if (options.update_interval < 1 || options.select_interval < 1 ||
      options.select_interval % options.update_interval != 0) {
    return absl::InvalidArgumentError(absl::StrCat("zenflow: select_interval (", options.select_interval,
                                                   ") must be a positive multiple of update_interval (",
                                                   options.update_interval, ")"));
  }
  if (options.full_warm_up_steps < 0 || options.full_warm_up_steps % options.update_interval != 0) {
    return absl::InvalidArgumentError(absl::StrCat("zenflow: full_warm_up_steps (", options.full_warm_up_steps,
                                                   ") must be a non-negative multiple of update_interval (",
                                                   options.update_interval, ")"));
  }
  for (const ZenFlowSegment& s : segments) {
    if (s.opt + s.len > opt_size) {
      return absl::InvalidArgumentError("zenflow: a segment lies outside the optimizer state");
    }
  }
  for (const ZenFlowMatrix& m : options.matrices) {
    if (m.rows == 0 || m.cols == 0) return absl::InvalidArgumentError("zenflow: an empty matrix");
  }
  std::unique_ptr<ZenFlow> z(new ZenFlow(options, adamw, opt_size));
  std::sort(z->options_.matrices.begin(), z->options_.matrices.end(),
            [](const ZenFlowMatrix& a, const ZenFlowMatrix& b) { return a.offset < b.offset; });
  // A weight listed twice (a tied embedding and LM head) counts once.
  auto& mats = z->options_.matrices;
  mats.erase(std::unique(mats.begin(), mats.end(),
                         [](const ZenFlowMatrix& a, const ZenFlowMatrix& b) {
                           return a.offset == b.offset && a.rows == b.rows && a.cols == b.cols;
                         }),
             mats.end());
  for (size_t i = 1; i < mats.size(); ++i) {
    const ZenFlowMatrix& a = mats[i - 1];
    if (a.offset + a.rows * a.cols > mats[i].offset) return absl::InvalidArgumentError("zenflow: matrices overlap");
  }
  std::sort(segments.begin(), segments.end(),
            [](const ZenFlowSegment& a, const ZenFlowSegment& b) { return a.global < b.global; });
  z->BuildRows(segments);
  z->segments_ = std::move(segments);
  return z;
}

ZenFlow::ZenFlow(const ZenFlowOptions& options, const ZenFlowAdamW& adamw, size_t opt_size)
    : options_(options), adamw_(adamw), opt_size_(opt_size) {
  g_host_.assign(opt_size, 0.f);
  acc_[0].assign(opt_size, 0.f);
  acc_[1].assign(opt_size, 0.f);
  hp_.assign(opt_size, 0.f);
  hm_.assign(opt_size, 0.f);
  hv_.assign(opt_size, 0.f);
}

void ZenFlow::BuildRows(const std::vector<ZenFlowSegment>& segments) {
  const std::vector<ZenFlowMatrix>& mats = options_.matrices;
  for (size_t si = 0; si < segments.size(); ++si) {
    const ZenFlowSegment& seg = segments[si];
    const size_t end = seg.global + seg.len;
    auto add = [&](size_t from, size_t to, int group) {
      const size_t d = from - seg.global;
      rows_.push_back({seg.opt + d, seg.param + d, seg.grad + d, to - from, group, static_cast<int>(si)});
    };
    size_t pos = seg.global;
    // First matrix that ends after pos.
    auto it = std::upper_bound(mats.begin(), mats.end(), pos,
                               [](size_t x, const ZenFlowMatrix& m) { return x < m.offset + m.rows * m.cols; });
    while (pos < end) {
      if (it == mats.end() || it->offset >= end) {
        add(pos, end, -1);
        break;
      }
      if (it->offset > pos) {
        add(pos, it->offset, -1);
        pos = it->offset;
      }
      const size_t mend = std::min(end, it->offset + it->rows * it->cols);
      Group g;
      g.first = rows_.size();
      while (pos < mend) {
        const size_t row_end = it->offset + ((pos - it->offset) / it->cols + 1) * it->cols;
        const size_t to = std::min(row_end, mend);
        add(pos, to, static_cast<int>(groups_.size()));
        pos = to;
      }
      g.count = rows_.size() - g.first;
      g.k = std::clamp<size_t>(static_cast<size_t>(std::ceil(options_.topk_fraction * static_cast<double>(g.count))), 1,
                               g.count);
      groups_.push_back(g);
      ++it;
    }
  }
  size_t max_group = 0;
  for (const Group& g : groups_) max_group = std::max(max_group, g.count);
  important_.assign(rows_.size(), 1);
  prev_important_.assign(rows_.size(), 1);
  norms_.assign(max_group, 0.0);
  order_.assign(max_group, 0);
  dev_runs_.reserve(rows_.size());
  host_runs_.reserve(rows_.size());
  job_runs_.reserve(rows_.size());
  RebuildRuns();
}

void ZenFlow::Select() {
  for (const Group& g : groups_) {
    if (g.k == g.count) {
      for (size_t i = 0; i < g.count; ++i) important_[g.first + i] = 1;
      continue;
    }
    for (size_t i = 0; i < g.count; ++i) {
      const Row& r = rows_[g.first + i];
      const float* x = g_host_.data() + r.opt;
      double s = 0;
      for (size_t j = 0; j < r.len; ++j) s += static_cast<double>(x[j]) * x[j];
      norms_[i] = s;
      order_[i] = static_cast<uint32_t>(i);
    }
    const double* n = norms_.data();
    std::nth_element(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(g.k),
                     order_.begin() + static_cast<std::ptrdiff_t>(g.count),
                     [n](uint32_t a, uint32_t b) { return n[a] > n[b] || (n[a] == n[b] && a < b); });
    for (size_t i = 0; i < g.count; ++i) important_[g.first + i] = 0;
    for (size_t i = 0; i < g.k; ++i) important_[g.first + order_[i]] = 1;
  }
}

void ZenFlow::RebuildRuns() {
  dev_runs_.clear();
  host_runs_.clear();
  size_t matrix_total = 0, matrix_important = 0;
  int last_dev = -1, last_host = -1;  // segment of the last run
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Row& r = rows_[i];
    if (r.group >= 0) {
      matrix_total += r.len;
      if (important_[i]) matrix_important += r.len;
    }
    if (important_[i]) {
      // Runs never cross segments: the device calls match plain AdamW's.
      if (!dev_runs_.empty() && last_dev == r.segment && Adjacent(dev_runs_.back(), r.opt, r.param) &&
          dev_runs_.back().grad + dev_runs_.back().len == r.grad) {
        dev_runs_.back().len += r.len;
      } else {
        dev_runs_.push_back({r.opt, r.param, r.grad, r.len});
        last_dev = r.segment;
      }
    } else if (!host_runs_.empty() && last_host == r.segment && Adjacent(host_runs_.back(), r.opt, r.param)) {
      host_runs_.back().len += r.len;
    } else {
      host_runs_.push_back({r.opt, r.param, r.len});
      last_host = r.segment;
    }
  }
  stats_.important_fraction =
      matrix_total == 0 ? 1.0 : static_cast<double>(matrix_important) / static_cast<double>(matrix_total);
}

void ZenFlow::MoveToHost(const ZenFlowDevice& d, const Row& r) {
  const size_t bytes = r.len * sizeof(float);
  d.mem->CopyToHost(hp_.data() + r.opt, d.p + r.param, bytes);
  d.mem->CopyToHost(hm_.data() + r.opt, d.m + r.opt, bytes);
  d.mem->CopyToHost(hv_.data() + r.opt, d.v + r.opt, bytes);
}

void ZenFlow::FinishInFlight(const ZenFlowDevice& d, bool apply) {
  if (!in_flight_) return;
  const auto t0 = std::chrono::steady_clock::now();
  const double compute = updater_.Wait();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  in_flight_ = false;
  stats_.host_update_s += compute;
  stats_.host_wait_s += waited;
  stats_.host_hidden_s += std::max(0.0, compute - waited);
  ++stats_.host_updates;
  if (!apply) return;
  for (const ZenFlowHostUpdater::Run& run : job_runs_) {
    d.mem->CopyToDevice(d.p + run.param, hp_.data() + run.opt, run.len * sizeof(float));
  }
}

void ZenFlow::Reselect(const ZenFlowDevice& d, float lr, int64_t step) {
  prev_important_ = important_;
  Select();
  const float scale = acc_steps_ > 0 ? 1.0f / static_cast<float>(acc_steps_) : 0.f;
  float* acc = acc_[cur_].data();
  const ZenFlowAdamW& a = adamw_;
  job_runs_.clear();
  int last = -1;
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Row& r = rows_[i];
    const bool was = prev_important_[i] != 0, now = important_[i] != 0;
    const size_t bytes = r.len * sizeof(float);
    if (!was && now) {
      // Its pending host update runs on the device, with its host moments.
      d.mem->CopyToDevice(d.m + r.opt, hm_.data() + r.opt, bytes);
      d.mem->CopyToDevice(d.v + r.opt, hv_.data() + r.opt, bytes);
      float* g = acc + r.opt;
      for (size_t j = 0; j < r.len; ++j) g[j] *= scale;
      d.mem->CopyToDevice(d.g + r.grad, g, bytes);
      d.ops->adamw_step(d.p + r.param, d.g + r.grad, d.m + r.opt, d.v + r.opt, r.len, lr, a.beta1, a.beta2, a.eps,
                        a.weight_decay, HostCount(step));
      std::fill(g, g + r.len, 0.f);
    } else if (was && !now) {
      MoveToHost(d, r);
    } else if (!was && !now) {
      if (!job_runs_.empty() && last == r.segment && Adjacent(job_runs_.back(), r.opt, r.param)) {
        job_runs_.back().len += r.len;
      } else {
        job_runs_.push_back({r.opt, r.param, r.len});
        last = r.segment;
      }
    }
  }
  RebuildRuns();
}

absl::Status ZenFlow::Step(const ZenFlowDevice& d, float lr, int64_t step) {
  const ZenFlowAdamW& a = adamw_;
  if (!selected_ && step <= options_.full_warm_up_steps) {
    // Warm-up: every row is important, the calls are plain AdamW's.
    for (const DevRun& r : dev_runs_) {
      d.ops->adamw_step(d.p + r.param, d.g + r.grad, d.m + r.opt, d.v + r.opt, r.len, lr, a.beta1, a.beta2, a.eps,
                        a.weight_decay, step);
    }
    if (!d.mem->ok()) return absl::InternalError("zenflow: device memory: " + d.mem->last_error());
    return absl::OkStatus();
  }
  for (const ZenFlowSegment& s : segments_) {
    d.mem->CopyToHost(g_host_.data() + s.opt, d.g + s.grad, s.len * sizeof(float));
  }
  if (!selected_) {
    Select();
    for (size_t i = 0; i < rows_.size(); ++i) {
      if (!important_[i]) MoveToHost(d, rows_[i]);
    }
    RebuildRuns();
    selected_ = true;
    acc_steps_ = 0;
  }
  for (const DevRun& r : dev_runs_) {
    d.ops->adamw_step(d.p + r.param, d.g + r.grad, d.m + r.opt, d.v + r.opt, r.len, lr, a.beta1, a.beta2, a.eps,
                      a.weight_decay, step);
  }
  float* acc = acc_[cur_].data();
  const float* g = g_host_.data();
  for (const ZenFlowHostUpdater::Run& r : host_runs_) {
    for (size_t j = r.opt; j < r.opt + r.len; ++j) acc[j] += g[j];
  }
  ++acc_steps_;
  const int64_t interval = options_.update_interval;
  if (step % interval == 0) {
    FinishInFlight(d, /*apply=*/true);
    job_runs_.assign(host_runs_.begin(), host_runs_.end());
    if (step % options_.select_interval == 0) Reselect(d, lr, step);
    if (!job_runs_.empty()) {
      ZenFlowHostUpdater::Job job;
      job.runs = &job_runs_;
      job.acc = acc;
      job.p = hp_.data();
      job.m = hm_.data();
      job.v = hv_.data();
      job.grad_scale = 1.0f / static_cast<float>(acc_steps_);
      job.lr = lr;
      job.beta1 = a.beta1;
      job.beta2 = a.beta2;
      job.eps = a.eps;
      job.weight_decay = a.weight_decay;
      job.step = HostCount(step);
      updater_.Submit(job);
      in_flight_ = true;
      cur_ ^= 1;
    }
    acc_steps_ = 0;
  }
  if (!d.mem->ok()) return absl::InternalError("zenflow: device memory: " + d.mem->last_error());
  return absl::OkStatus();
}

bool ZenFlow::Sync(const ZenFlowDevice& d) {
  const bool changed = in_flight_;
  FinishInFlight(d, /*apply=*/true);
  for (const ZenFlowHostUpdater::Run& r : host_runs_) {
    const size_t bytes = r.len * sizeof(float);
    if (d.moments_on_host) {
      std::memcpy(d.m + r.opt, hm_.data() + r.opt, bytes);
      std::memcpy(d.v + r.opt, hv_.data() + r.opt, bytes);
    } else {
      d.mem->CopyToDevice(d.m + r.opt, hm_.data() + r.opt, bytes);
      d.mem->CopyToDevice(d.v + r.opt, hv_.data() + r.opt, bytes);
    }
  }
  return changed;
}

void ZenFlow::Reset() {
  updater_.Wait();
  in_flight_ = false;
  selected_ = false;
  std::fill(important_.begin(), important_.end(), 1);
  std::fill(acc_[0].begin(), acc_[0].end(), 0.f);
  std::fill(acc_[1].begin(), acc_[1].end(), 0.f);
  cur_ = 0;
  acc_steps_ = 0;
  job_runs_.clear();
  RebuildRuns();
}

void ZenFlow::CopyState(float* acc, float* important) const {
  std::memcpy(acc, acc_[cur_].data(), opt_size_ * sizeof(float));
  std::fill(important, important + opt_size_, 1.f);
  for (size_t i = 0; i < rows_.size(); ++i) {
    if (!important_[i]) std::fill(important + rows_[i].opt, important + rows_[i].opt + rows_[i].len, 0.f);
  }
}

int64_t ZenFlow::HostCount(int64_t step) const {
  const int64_t w = options_.full_warm_up_steps;
  return w + (step - w) / options_.update_interval;
}

void ZenFlow::LoadState(const ZenFlowDevice& d, const float* acc, const float* important, int64_t step) {
  Reset();
  if (step <= options_.full_warm_up_steps) return;  // no selection yet
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Row& r = rows_[i];
    important_[i] = r.group < 0 || important[r.opt] != 0.f ? 1 : 0;
    if (!important_[i]) {
      std::memcpy(acc_[cur_].data() + r.opt, acc + r.opt, r.len * sizeof(float));
      MoveToHost(d, r);
    }
  }
  RebuildRuns();
  selected_ = true;
  acc_steps_ = step % options_.update_interval;
}

}  // namespace tandem::zero
