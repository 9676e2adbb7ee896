// Counter and histogram families in Prometheus' text exposition format
// (version 0.0.4), for the coordinator's /metrics.
//
// A family has a name, a help line and fixed label names; a child (one set
// of label values) is created on first use and lives as long as the family.
// Label values must come from bounded sets (enum names, RPC method names):
// the caller's contract, since every child is kept forever.
// Thread-safe: each family guards its children with its own mutex.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem::server {

class CounterFamily {
 public:
  CounterFamily(std::string name, std::string help, std::vector<std::string> label_names);
  CounterFamily(const CounterFamily&) = delete;
  CounterFamily& operator=(const CounterFamily&) = delete;

  // delta < 0 is ignored (a counter only goes up). label_values must have
  // one value per label name (CHECKed).
  void Add(const std::vector<std::string>& label_values, double delta);
  void Increment(const std::vector<std::string>& label_values) { Add(label_values, 1); }
  double Value(const std::vector<std::string>& label_values) const;
  // Appends "# HELP", "# TYPE" and one sample per child (sorted by labels).
  void Render(std::string* out) const;

 private:
  const std::string name_, help_;
  const std::vector<std::string> label_names_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, double> values_ ABSL_GUARDED_BY(mu_);
};

class HistogramFamily {
 public:
  // bounds: the buckets' upper limits, strictly increasing (CHECKed); +Inf is implied.
  HistogramFamily(std::string name, std::string help, std::vector<std::string> label_names, std::vector<double> bounds);
  HistogramFamily(const HistogramFamily&) = delete;
  HistogramFamily& operator=(const HistogramFamily&) = delete;

  void Observe(const std::vector<std::string>& label_values, double value);
  // Creates the child with no observations, so that it is exported at 0.
  void Touch(const std::vector<std::string>& label_values);
  uint64_t Count(const std::vector<std::string>& label_values) const;
  // Appends the _bucket (cumulative, with le="+Inf"), _sum and _count samples.
  void Render(std::string* out) const;

 private:
  struct Child {
    std::vector<uint64_t> buckets;  // not cumulative; one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Child& ChildLocked(const std::vector<std::string>& label_values) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_, help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, Child> children_ ABSL_GUARDED_BY(mu_);
};

// Escapes a label value for the text format (backslash, quote, newline).
std::string PrometheusLabelValue(const std::string& value);
// A sample value: integers without a fraction, others with 17 digits; NaN and infinities by name.
std::string PrometheusNumber(double value);

}  // namespace tandem::server
