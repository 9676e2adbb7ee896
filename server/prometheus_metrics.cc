#include "server/prometheus_metrics.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "spdlog/spdlog.h"

namespace tandem::server {
namespace {

void CheckLabels(const std::string& family, const std::vector<std::string>& names,
                 const std::vector<std::string>& values) {
  if (names.size() != values.size()) {
    spdlog::critical("metric {}: {} label values for {} label names", family, values.size(), names.size());
    std::abort();
  }
}

// {a="x",b="y"} plus an optional extra pair (le for buckets); "" when empty.
std::string LabelSet(const std::vector<std::string>& names, const std::vector<std::string>& values,
                     const std::string& extra_name = "", const std::string& extra_value = "") {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppend(&out, out.empty() ? "{" : ",", names[i], "=\"", PrometheusLabelValue(values[i]), "\"");
  }
  if (!extra_name.empty()) absl::StrAppend(&out, out.empty() ? "{" : ",", extra_name, "=\"", extra_value, "\"");
  if (!out.empty()) out += "}";
  return out;
}

void Header(std::string* out, const std::string& name, const std::string& help, const char* type) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

}  // namespace

std::string PrometheusLabelValue(const std::string& value) {
  return absl::StrReplaceAll(value, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

std::string PrometheusNumber(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) return absl::StrFormat("%.0f", value);
  // The shortest of 15..17 significant digits that reads back as the same double.
  for (int digits = 15; digits < 17; ++digits) {
    std::string s = absl::StrFormat("%.*g", digits, value);
    if (std::strtod(s.c_str(), nullptr) == value) return s;
  }
  return absl::StrFormat("%.17g", value);
}

CounterFamily::CounterFamily(std::string name, std::string help, std::vector<std::string> label_names)
    : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)) {}

void CounterFamily::Add(const std::vector<std::string>& label_values, double delta) {
  CheckLabels(name_, label_names_, label_values);
  absl::MutexLock lock(&mu_);
  double& v = values_[label_values];
  if (delta > 0) v += delta;
}

double CounterFamily::Value(const std::vector<std::string>& label_values) const {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(label_values);
  return it == values_.end() ? 0 : it->second;
}

void CounterFamily::Render(std::string* out) const {
  Header(out, name_, help_, "counter");
  absl::MutexLock lock(&mu_);
  for (const auto& [labels, v] : values_) {
    absl::StrAppend(out, name_, LabelSet(label_names_, labels), " ", PrometheusNumber(v), "\n");
  }
}

HistogramFamily::HistogramFamily(std::string name, std::string help, std::vector<std::string> label_names,
                                 std::vector<double> bounds)
    : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)), bounds_(std::move(bounds)) {
  for (size_t i = 1; i < bounds_.size(); ++i) {
    if (!(bounds_[i - 1] < bounds_[i])) {
      spdlog::critical("histogram {}: bucket bounds not strictly increasing", name_);
      std::abort();
    }
  }
}

HistogramFamily::Child& HistogramFamily::ChildLocked(const std::vector<std::string>& label_values) {
  CheckLabels(name_, label_names_, label_values);
  Child& c = children_[label_values];
  if (c.buckets.empty()) c.buckets.assign(bounds_.size() + 1, 0);
  return c;
}

void HistogramFamily::Observe(const std::vector<std::string>& label_values, double value) {
  if (std::isnan(value)) return;
  absl::MutexLock lock(&mu_);
  Child& c = ChildLocked(label_values);
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  c.buckets[i]++;
  c.sum += value;
  c.count++;
}

void HistogramFamily::Touch(const std::vector<std::string>& label_values) {
  absl::MutexLock lock(&mu_);
  ChildLocked(label_values);
}

uint64_t HistogramFamily::Count(const std::vector<std::string>& label_values) const {
  absl::MutexLock lock(&mu_);
  auto it = children_.find(label_values);
  return it == children_.end() ? 0 : it->second.count;
}

void HistogramFamily::Render(std::string* out) const {
  Header(out, name_, help_, "histogram");
  absl::MutexLock lock(&mu_);
  for (const auto& [labels, c] : children_) {
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= bounds_.size(); ++i) {
      cumulative += c.buckets[i];
      const std::string le = i < bounds_.size() ? PrometheusNumber(bounds_[i]) : "+Inf";
      absl::StrAppend(out, name_, "_bucket", LabelSet(label_names_, labels, "le", le), " ", cumulative, "\n");
    }
    absl::StrAppend(out, name_, "_sum", LabelSet(label_names_, labels), " ", PrometheusNumber(c.sum), "\n");
    absl::StrAppend(out, name_, "_count", LabelSet(label_names_, labels), " ", c.count, "\n");
  }
}

}  // namespace tandem::server
