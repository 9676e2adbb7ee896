// Built-in tasks: see tasks.h for the contract.
#include "worker/rl/tasks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/rl/counter_rng.h"

namespace tandem::rl {
namespace {

// Streams keep training and evaluation draws independent.
constexpr uint64_t kTrainStream = 0x7472616eULL;  // "tran"
constexpr uint64_t kEvalStream = 0x6576616cULL;   // "eval"
// One in kHeldOutBuckets instances is held out.
constexpr uint64_t kHeldOutBuckets = 8;
// Rejection sampling bound: with at least kMinInstances instances the
// held-out part is non-empty with overwhelming probability; exceeding this
// bound is an internal error.
constexpr int kMaxAttempts = 1 << 20;
constexpr double kMinInstances = 100;
constexpr int kMaxLen = 64;
constexpr int kDefaultDigits = 2;
constexpr int kDefaultMinLen = 2;
constexpr int kDefaultMaxLen = 6;

constexpr std::string_view kDigits = "0123456789";
constexpr std::string_view kLetters = "abcdefghijklmnopqrstuvwxyz";

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

int DecimalDigits(uint64_t v) {
  int n = 1;
  while (v >= 10) {
    v /= 10;
    ++n;
  }
  return n;
}

uint64_t Pow10(int d) {
  uint64_t p = 1;
  for (int i = 0; i < d; ++i) p *= 10;
  return p;
}

[[noreturn]] void Die(std::string_view what) {
  std::fprintf(stderr, "%s:%d: internal error: %.*s\n", __FILE__, __LINE__, static_cast<int>(what.size()), what.data());
  std::abort();
}

class ArithmeticTask final : public Task {
 public:
  ArithmeticTask(bool mul, int digits, double format_reward) : Task(format_reward), mul_(mul), digits_(digits) {}
  std::string name() const override { return "arithmetic"; }
  int max_prompt_chars() const override { return 2 * digits_ + 2; }
  int max_answer_chars() const override { return mul_ ? 2 * digits_ : digits_ + 1; }
  std::string_view answer_alphabet() const override { return kDigits; }

 protected:
  Example Generate(uint64_t key) const override {
    CounterRng rng(key);
    const uint64_t limit = Pow10(digits_);
    const uint64_t a = rng.Uniform(limit);
    const uint64_t b = rng.Uniform(limit);
    Example ex;
    ex.prompt = absl::StrCat(a, mul_ ? "*" : "+", b, "=");
    ex.answer = absl::StrCat(mul_ ? a * b : a + b);
    return ex;
  }

 private:
  bool mul_;
  int digits_;
};

// Tasks over a random string of length in [min_len, max_len].
class StringTask : public Task {
 public:
  StringTask(int min_len, int max_len, double format_reward)
      : Task(format_reward), min_len_(min_len), max_len_(max_len) {}

 protected:
  std::string RandomString(CounterRng& rng, std::string_view alphabet) const {
    const int len = static_cast<int>(rng.UniformInt(min_len_, max_len_));
    std::string s(len, ' ');
    for (char& c : s) c = alphabet[rng.Uniform(alphabet.size())];
    return s;
  }
  int min_len_;
  int max_len_;
};

class SortTask final : public StringTask {
 public:
  using StringTask::StringTask;
  std::string name() const override { return "sort"; }
  int max_prompt_chars() const override { return max_len_ + 6; }
  int max_answer_chars() const override { return max_len_; }
  std::string_view answer_alphabet() const override { return kDigits; }

 protected:
  Example Generate(uint64_t key) const override {
    CounterRng rng(key);
    std::string s = RandomString(rng, kDigits);
    Example ex;
    ex.prompt = absl::StrCat("sort:", s, "=");
    std::sort(s.begin(), s.end());
    ex.answer = std::move(s);
    return ex;
  }
};

class ReverseTask final : public StringTask {
 public:
  using StringTask::StringTask;
  std::string name() const override { return "reverse"; }
  int max_prompt_chars() const override { return max_len_ + 5; }
  int max_answer_chars() const override { return max_len_; }
  std::string_view answer_alphabet() const override { return kLetters; }

 protected:
  Example Generate(uint64_t key) const override {
    CounterRng rng(key);
    std::string s = RandomString(rng, kLetters);
    Example ex;
    ex.prompt = absl::StrCat("rev:", s, "=");
    std::reverse(s.begin(), s.end());
    ex.answer = std::move(s);
    return ex;
  }
};

// "count:a:banana=" -> "3". The target letter is uniform; each character of
// the string is the target with probability 1/3, otherwise a uniform letter,
// so counts spread over 0..len instead of piling up at 0 and 1.
class CountTask final : public StringTask {
 public:
  using StringTask::StringTask;
  std::string name() const override { return "count"; }
  int max_prompt_chars() const override { return max_len_ + 9; }
  int max_answer_chars() const override { return DecimalDigits(max_len_); }
  std::string_view answer_alphabet() const override { return kDigits; }

 protected:
  Example Generate(uint64_t key) const override {
    CounterRng rng(key);
    const char target = kLetters[rng.Uniform(kLetters.size())];
    const int len = static_cast<int>(rng.UniformInt(min_len_, max_len_));
    std::string s(len, ' ');
    int count = 0;
    for (char& c : s) {
      c = rng.Uniform(3) == 0 ? target : kLetters[rng.Uniform(kLetters.size())];
      count += c == target;
    }
    Example ex;
    ex.prompt = absl::StrCat("count:", std::string(1, target), ":", s, "=");
    ex.answer = absl::StrCat(count);
    return ex;
  }
};

// Number of strings over `alphabet` symbols with length in [lo, hi].
double StringSpace(double alphabet, int lo, int hi) {
  double n = 0;
  for (int len = lo; len <= hi; ++len) n += std::pow(alphabet, len);
  return n;
}

}  // namespace

bool Task::IsHeldOut(std::string_view prompt) { return SplitMix64(Fnv1a(prompt)) % kHeldOutBuckets == 0; }

Example Task::Sample(uint64_t seed, uint64_t index) const {
  const uint64_t key = Mix(seed, index, kTrainStream);
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    Example ex = Generate(Mix(key, attempt));
    if (!IsHeldOut(ex.prompt)) return ex;
  }
  Die("Task::Sample found no training instance");
}

std::vector<Example> Task::EvalExamples(uint64_t seed, int n) const {
  std::vector<Example> out;
  out.reserve(std::max(n, 0));
  std::unordered_set<std::string> seen;
  // Draws held-out instances in a fixed order; skips repeats while fresh
  // ones keep coming, so small held-out parts repeat instead of failing.
  uint64_t draw = 0;
  int misses = 0;
  while (static_cast<int>(out.size()) < n) {
    Example ex;
    bool found = false;
    for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
      ex = Generate(Mix(seed, draw++, kEvalStream));
      if (IsHeldOut(ex.prompt)) {
        found = true;
        break;
      }
    }
    if (!found) Die("Task::EvalExamples found no held-out instance");
    if (seen.insert(ex.prompt).second || misses >= 64) {
      misses = 0;
      out.push_back(std::move(ex));
    } else {
      ++misses;
    }
  }
  return out;
}

RewardResult Task::Reward(const Example& example, std::string_view completion, bool terminated) const {
  RewardResult r;
  r.well_formed = terminated && !completion.empty() && static_cast<int>(completion.size()) <= max_answer_chars() &&
                  completion.find_first_not_of(answer_alphabet()) == std::string_view::npos;
  r.correct = terminated && completion == example.answer;
  double credit = r.correct ? 1.0 : 0.0;
  if (!r.correct && r.well_formed && partial_reward_ > 0) {
    const std::string_view& a = example.answer;
    const size_t longer = std::max(a.size(), completion.size());
    size_t same = 0;
    for (size_t i = 1; i <= std::min(a.size(), completion.size()); ++i) {
      same += a[a.size() - i] == completion[completion.size() - i];
    }
    credit = partial_reward_ * static_cast<double>(same) / static_cast<double>(longer);
  }
  r.reward = credit + (r.well_formed ? format_reward_ : 0.0);
  return r;
}

namespace {
absl::StatusOr<std::unique_ptr<Task>> MakeTaskOfKind(const TaskOptions& o);
}  // namespace

absl::StatusOr<std::unique_ptr<Task>> MakeTask(const TaskOptions& o) {
  if (!std::isfinite(o.partial_reward) || o.partial_reward < 0 || o.partial_reward > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.partial_reward must be a number in [0, 1], got ", o.partial_reward));
  }
  auto task = MakeTaskOfKind(o);
  if (task.ok()) (*task)->partial_reward_ = o.partial_reward;
  return task;
}

namespace {
absl::StatusOr<std::unique_ptr<Task>> MakeTaskOfKind(const TaskOptions& o) {
  if (!std::isfinite(o.format_reward) || o.format_reward < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.format_reward must be a finite number >= 0, got ", o.format_reward));
  }
  if (o.name == "arithmetic") {
    const std::string op = o.op.empty() ? "add" : o.op;
    if (op != "add" && op != "mul") {
      return absl::InvalidArgumentError(
          absl::StrCat("task.op must be \"add\" or \"mul\" for the arithmetic task, got \"", o.op, "\""));
    }
    const int digits = o.digits == 0 ? kDefaultDigits : o.digits;
    if (digits < 1 || digits > 9) {
      return absl::InvalidArgumentError(
          absl::StrCat("task.digits must be in [1, 9] for the arithmetic task, got ", o.digits));
    }
    return std::make_unique<ArithmeticTask>(op == "mul", digits, o.format_reward);
  }
  if (o.name != "sort" && o.name != "reverse" && o.name != "count") {
    return absl::InvalidArgumentError(
        absl::StrCat("task.name must be one of arithmetic, sort, reverse, count; got \"", o.name, "\""));
  }
  if (!o.op.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.op applies only to the arithmetic task; remove it for ", o.name));
  }
  if (o.digits != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.digits applies only to the arithmetic task; use "
                     "task.min_len/task.max_len for ",
                     o.name));
  }
  const int min_len = o.min_len == 0 ? kDefaultMinLen : o.min_len;
  const int max_len = o.max_len == 0 ? std::max(kDefaultMaxLen, min_len) : o.max_len;
  if (min_len < 1 || min_len > kMaxLen) {
    return absl::InvalidArgumentError(absl::StrCat("task.min_len must be in [1, ", kMaxLen, "], got ", o.min_len));
  }
  if (max_len < min_len || max_len > kMaxLen) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.max_len must be in [task.min_len=", min_len, ", ", kMaxLen, "], got ", o.max_len));
  }
  double space = 0;
  std::unique_ptr<Task> task;
  if (o.name == "sort") {
    space = StringSpace(10, min_len, max_len);
    task = std::make_unique<SortTask>(min_len, max_len, o.format_reward);
  } else if (o.name == "reverse") {
    space = StringSpace(26, min_len, max_len);
    task = std::make_unique<ReverseTask>(min_len, max_len, o.format_reward);
  } else {
    space = 26 * StringSpace(26, min_len, max_len);
    task = std::make_unique<CountTask>(min_len, max_len, o.format_reward);
  }
  if (space < kMinInstances) {
    return absl::InvalidArgumentError(absl::StrCat("task.max_len: the ", o.name, " task with lengths [", min_len, ", ",
                                                   max_len, "] has only ", space,
                                                   " distinct prompts; at least 100 are needed to hold out evaluation "
                                                   "examples (raise task.max_len)"));
  }
  return task;
}
}  // namespace

}  // namespace tandem::rl
