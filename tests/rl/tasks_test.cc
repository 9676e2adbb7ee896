// Built-in tasks: determinism, correct answers, held-out disjointness,
// rewards and option validation.
#include "worker/rl/tasks.h"

#include <gtest/gtest.h>

#include <cmath>

#include <algorithm>
#include <set>
#include <string>

namespace tandem::rl {
namespace {

std::unique_ptr<Task> Make(TaskOptions o) {
  auto t = MakeTask(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

TEST(TasksTest, SampleIsPureFunctionOfSeedAndIndex) {
  auto task = Make({.name = "arithmetic", .op = "add", .digits = 3});
  const Example a = task->Sample(7, 123);
  for (int i = 0; i < 50; ++i) task->Sample(9, i);  // unrelated draws
  const Example b = task->Sample(7, 123);
  EXPECT_EQ(a.prompt, b.prompt);
  EXPECT_EQ(a.answer, b.answer);
  std::set<std::string> prompts;
  for (int i = 0; i < 200; ++i) prompts.insert(task->Sample(7, i).prompt);
  EXPECT_GT(prompts.size(), 190u);
  EXPECT_NE(task->Sample(7, 5).prompt, task->Sample(8, 5).prompt);
}

TEST(TasksTest, ArithmeticAnswersAndOperandRange) {
  for (const char* op : {"add", "mul"}) {
    auto task = Make({.name = "arithmetic", .op = op, .digits = 2});
    bool saw_two_digit = false, saw_one_digit = false;
    for (int i = 0; i < 500; ++i) {
      const Example ex = task->Sample(1, i);
      const size_t sym = ex.prompt.find(op[0] == 'a' ? '+' : '*');
      ASSERT_NE(sym, std::string::npos) << ex.prompt;
      ASSERT_EQ(ex.prompt.back(), '=');
      const long a = std::stol(ex.prompt.substr(0, sym));
      const long b = std::stol(ex.prompt.substr(sym + 1));
      ASSERT_GE(a, 0);
      ASSERT_LT(a, 100);
      ASSERT_LT(b, 100);
      saw_two_digit |= a >= 10;
      saw_one_digit |= a < 10;
      EXPECT_EQ(ex.answer, std::to_string(op[0] == 'a' ? a + b : a * b));
      EXPECT_LE(static_cast<int>(ex.prompt.size()), task->max_prompt_chars());
      EXPECT_LE(static_cast<int>(ex.answer.size()), task->max_answer_chars());
    }
    EXPECT_TRUE(saw_two_digit && saw_one_digit);
  }
  auto t = Make({.name = "arithmetic", .digits = 1});
  EXPECT_EQ(t->max_answer_chars(), 2);
}

TEST(TasksTest, StringTaskAnswers) {
  auto sort = Make({.name = "sort", .min_len = 3, .max_len = 7});
  auto rev = Make({.name = "reverse", .min_len = 3, .max_len = 7});
  auto count = Make({.name = "count", .min_len = 3, .max_len = 12});
  std::set<std::string> counts;
  for (int i = 0; i < 300; ++i) {
    Example s = sort->Sample(3, i);
    ASSERT_EQ(s.prompt.rfind("sort:", 0), 0u);
    std::string body = s.prompt.substr(5, s.prompt.size() - 6);
    ASSERT_GE(body.size(), 3u);
    ASSERT_LE(body.size(), 7u);
    std::sort(body.begin(), body.end());
    EXPECT_EQ(s.answer, body);

    Example r = rev->Sample(3, i);
    ASSERT_EQ(r.prompt.rfind("rev:", 0), 0u);
    std::string rbody = r.prompt.substr(4, r.prompt.size() - 5);
    std::reverse(rbody.begin(), rbody.end());
    EXPECT_EQ(r.answer, rbody);
    EXPECT_TRUE(std::all_of(rbody.begin(), rbody.end(), ::islower));

    Example c = count->Sample(3, i);
    ASSERT_EQ(c.prompt.rfind("count:", 0), 0u);
    const char letter = c.prompt[6];
    ASSERT_EQ(c.prompt[7], ':');
    const std::string str = c.prompt.substr(8, c.prompt.size() - 9);
    EXPECT_EQ(c.answer, std::to_string(std::count(str.begin(), str.end(), letter)));
    counts.insert(c.answer);
    EXPECT_LE(static_cast<int>(c.prompt.size()), count->max_prompt_chars());
  }
  EXPECT_GE(counts.size(), 5u);  // counts spread, not only 0 and 1
  EXPECT_EQ(count->Sample(0, 0).prompt.back(), '=');
}

TEST(TasksTest, HeldOutExamplesAreNeverTrainingExamples) {
  for (TaskOptions o :
       {TaskOptions{.name = "arithmetic", .digits = 2}, TaskOptions{.name = "sort", .min_len = 2, .max_len = 4},
        TaskOptions{.name = "reverse", .max_len = 3}, TaskOptions{.name = "count", .max_len = 3}}) {
    auto task = Make(o);
    std::set<std::string> train;
    for (uint64_t seed : {0, 1, 2}) {
      for (int i = 0; i < 1500; ++i) {
        Example ex = task->Sample(seed, i);
        EXPECT_FALSE(Task::IsHeldOut(ex.prompt));
        train.insert(ex.prompt);
      }
    }
    for (uint64_t seed : {0, 5}) {
      const auto eval = task->EvalExamples(seed, 100);
      ASSERT_EQ(eval.size(), 100u);
      std::set<std::string> distinct;
      for (const Example& ex : eval) {
        EXPECT_TRUE(Task::IsHeldOut(ex.prompt)) << ex.prompt;
        EXPECT_EQ(train.count(ex.prompt), 0u) << ex.prompt;
        distinct.insert(ex.prompt);
      }
      EXPECT_EQ(distinct.size(), 100u) << o.name;
    }
    // Same seed, same list; prefix-stable.
    auto a = task->EvalExamples(4, 30), b = task->EvalExamples(4, 10);
    for (int i = 0; i < 10; ++i) EXPECT_EQ(a[i].prompt, b[i].prompt);
  }
}

TEST(TasksTest, SmallestInstanceSpacesStillGiveHeldOutExamples) {
  for (TaskOptions o : {TaskOptions{.name = "arithmetic", .op = "add", .digits = 1},
                        TaskOptions{.name = "arithmetic", .op = "mul", .digits = 1},
                        TaskOptions{.name = "sort", .min_len = 2, .max_len = 2},
                        TaskOptions{.name = "reverse", .min_len = 2, .max_len = 2},
                        TaskOptions{.name = "count", .min_len = 1, .max_len = 1}}) {
    auto task = Make(o);
    const auto eval = task->EvalExamples(0, 50);  // repeats allowed
    ASSERT_EQ(eval.size(), 50u);
    for (const Example& ex : eval) EXPECT_TRUE(Task::IsHeldOut(ex.prompt));
    for (int i = 0; i < 200; ++i) {
      EXPECT_FALSE(Task::IsHeldOut(task->Sample(0, i).prompt));
    }
  }
}

TEST(TasksTest, RewardIsExactMatchPlusFormat) {
  auto task = Make({.name = "arithmetic", .digits = 2, .format_reward = 0.1});
  const Example ex{"17+25=", "42"};
  RewardResult r = task->Reward(ex, "42");
  EXPECT_TRUE(r.correct);
  EXPECT_TRUE(r.well_formed);
  EXPECT_DOUBLE_EQ(r.reward, 1.1);
  r = task->Reward(ex, "41");
  EXPECT_FALSE(r.correct);
  EXPECT_TRUE(r.well_formed);
  EXPECT_DOUBLE_EQ(r.reward, 0.1);
  for (const char* bad : {" 42", "42 ", "42\n", "4a", "", "1234"}) {
    r = task->Reward(ex, bad);
    EXPECT_FALSE(r.correct) << bad;
    EXPECT_FALSE(r.well_formed) << bad;
    EXPECT_DOUBLE_EQ(r.reward, 0.0) << bad;
  }
  r = task->Reward(ex, "42", /*terminated=*/false);
  EXPECT_FALSE(r.correct);
  EXPECT_DOUBLE_EQ(r.reward, 0.0);
  auto plain = Make({.name = "reverse"});
  r = plain->Reward({"rev:abc=", "cba"}, "cba");
  EXPECT_DOUBLE_EQ(r.reward, 1.0);
  r = plain->Reward({"rev:abc=", "cba"}, "CBA");
  EXPECT_FALSE(r.correct);
  EXPECT_FALSE(r.well_formed);
}

TEST(TasksTest, PartialRewardCreditsPositionsFromTheEnd) {
  auto task = Make({.name = "arithmetic", .digits = 2, .partial_reward = 0.5});
  struct Case {
    const char* answer;
    const char* completion;
    bool terminated;
    double reward;
  };
  const Case cases[] = {
      {"42", "42", true, 1.0},           // exact: full reward, no partial part
      {"42", "43", true, 0.5 * 1 / 2},   // tens right
      {"42", "52", true, 0.5 * 1 / 2},   // units right
      {"42", "24", true, 0.0},           // digits swapped: no position agrees
      {"142", "42", true, 0.5 * 2 / 3},  // aligned at the end, over the longer
      {"42", "142", true, 0.5 * 2 / 3},
      {"100", "99", true, 0.0},
      {"42", "42", false, 0.0},  // no EOS: never credited
      {"42", "43", false, 0.0},
      {"42", "4a", true, 0.0},  // not well formed
      {"42", "", true, 0.0},
  };
  for (const Case& c : cases) {
    RewardResult r = task->Reward({"x", c.answer}, c.completion, c.terminated);
    EXPECT_DOUBLE_EQ(r.reward, c.reward) << c.answer << " vs " << c.completion;
  }
  // Off by default, and added to the format reward.
  EXPECT_DOUBLE_EQ(Make({.name = "arithmetic"})->Reward({"x", "42"}, "43").reward, 0.0);
  auto both = Make({.name = "arithmetic", .format_reward = 0.1, .partial_reward = 1.0});
  EXPECT_DOUBLE_EQ(both->Reward({"x", "42"}, "43").reward, 0.6);
  EXPECT_DOUBLE_EQ(both->Reward({"x", "42"}, "42").reward, 1.1);
}

TEST(TasksTest, ValidationNamesTheField) {
  auto err = [](TaskOptions o) {
    auto t = MakeTask(o);
    EXPECT_FALSE(t.ok());
    return std::string(t.status().message());
  };
  EXPECT_NE(err({.name = "chess"}).find("task.name"), std::string::npos);
  EXPECT_NE(err({.name = "arithmetic", .op = "div"}).find("task.op"), std::string::npos);
  EXPECT_NE(err({.name = "arithmetic", .digits = 10}).find("task.digits"), std::string::npos);
  EXPECT_NE(err({.name = "arithmetic", .digits = -1}).find("task.digits"), std::string::npos);
  EXPECT_NE(err({.name = "sort", .digits = 3}).find("task.digits"), std::string::npos);
  EXPECT_NE(err({.name = "sort", .op = "add"}).find("task.op"), std::string::npos);
  EXPECT_NE(err({.name = "sort", .min_len = 5, .max_len = 3}).find("task.max_len"), std::string::npos);
  EXPECT_NE(err({.name = "sort", .min_len = -2}).find("task.min_len"), std::string::npos);
  EXPECT_NE(err({.name = "reverse", .max_len = 65}).find("task.max_len"), std::string::npos);
  EXPECT_NE(err({.name = "sort", .min_len = 1, .max_len = 1}).find("hold out"), std::string::npos);
  EXPECT_NE(err({.name = "count", .format_reward = -1}).find("task.format_reward"), std::string::npos);
  for (double bad : {-0.1, 1.5, std::nan("")}) {
    EXPECT_NE(err({.name = "arithmetic", .partial_reward = bad}).find("task.partial_reward"), std::string::npos);
  }
  auto ok = MakeTask({.name = "count"});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->name(), "count");
}

}  // namespace
}  // namespace tandem::rl
