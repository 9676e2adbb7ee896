// Verifiable rewards (worker/rl/rewards.h): tricky cases for each rule.
#include "worker/rl/rewards.h"

#include <gtest/gtest.h>

namespace tandem::rl {
namespace {

struct Case {
  const char* response;
  const char* reference;
  bool correct;
};

std::unique_ptr<VerifiableReward> Make(const std::string& type, const std::string& pattern = "",
                                       double format_reward = 0, const std::string& format_pattern = "") {
  RewardOptions o;
  o.type = type;
  o.pattern = pattern;
  o.format_reward = format_reward;
  o.format_pattern = format_pattern;
  auto r = VerifiableReward::Create(o);
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(*r);
}

void Check(const VerifiableReward& r, const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    EXPECT_EQ(r.Score(c.response, c.reference).correct, c.correct)
        << "response: " << c.response << "\nreference: " << c.reference;
  }
}

TEST(Gsm8kRewardTest, Cases) {
  auto r = Make("gsm8k");
  Check(*r, {
                {"She has 3 + 4 = 7 apples.\n#### 7", "3+4=7\n#### 7", true},
                {"#### 42", "#### 42", true},
                {"The answer is 42.", "#### 42", true},                 // last number
                {"The answer is 42. Then 43 more.", "#### 42", false},  // last number is 43
                {"#### 42\nThen 17 more lines", "#### 42", true},       // after #### wins
                {"#### $1,000", "#### 1000", true},
                {"#### 1,000.00", "#### 1000", true},
                {"#### 42.0", "#### 42", true},
                {"#### 42.50", "#### 42.5", true},
                {"#### -5", "#### -5", true},
                {"#### 5", "#### -5", false},
                {"#### 1,2", "#### 12", false},  // not a thousands comma
                {"#### forty-two", "#### 42", false},
                {"no numbers here", "#### 42", false},
                {"", "#### 42", false},
                {"#### 42", "42", true},  // a bare reference
                {"we have 12 then #### 7.", "#### 7", true},
                {"#### 0.5", "#### .5", true},  // compared by value
                {"#### 0.5", "#### 0.50", true},
            });
}

TEST(Gsm8kRewardTest, FormatReward) {
  auto r = Make("gsm8k", "", 0.25);
  auto a = r->Score("so 7\n#### 7", "#### 7");
  EXPECT_TRUE(a.correct);
  EXPECT_TRUE(a.well_formed);
  EXPECT_DOUBLE_EQ(a.reward, 1.25);
  auto b = r->Score("the answer is 7", "#### 7");
  EXPECT_TRUE(b.correct);
  EXPECT_FALSE(b.well_formed);
  EXPECT_DOUBLE_EQ(b.reward, 1.0);
  auto c = r->Score("#### 8", "#### 7");
  EXPECT_DOUBLE_EQ(c.reward, 0.25);
}

TEST(Gsm8kRewardTest, Helpers) {
  EXPECT_EQ(NormalizeNumber("$1,234.50"), "1234.5");
  EXPECT_EQ(NormalizeNumber("42.0"), "42");
  EXPECT_EQ(NormalizeNumber("-3."), "-3");
  EXPECT_EQ(NormalizeNumber("-0.0"), "0");
  EXPECT_EQ(Gsm8kReferenceAnswer("a\nb\n#### 1,234"), "1234");
  EXPECT_EQ(*Gsm8kResponseAnswer("x 3 y 4"), "4");
  EXPECT_FALSE(Gsm8kResponseAnswer("none").has_value());
}

TEST(MathRewardTest, Boxed) {
  EXPECT_EQ(*LastBoxed("\\boxed{1} then \\boxed{\\frac{1}{2}}"), "\\frac{1}{2}");
  EXPECT_EQ(*LastBoxed("\\boxed{\\{1,2\\}}"), "\\{1,2\\}");
  EXPECT_EQ(*LastBoxed("so \\boxed 5$"), "5");
  EXPECT_EQ(*LastBoxed("\\fbox{x}"), "x");
  EXPECT_FALSE(LastBoxed("\\boxed{unbalanced").has_value());
  EXPECT_FALSE(LastBoxed("nothing").has_value());
}

TEST(MathRewardTest, Cases) {
  auto r = Make("math");
  Check(*r, {
                {"so \\boxed{\\frac{1}{2}}", "\\boxed{\\frac12}", true},
                {"\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", true},
                {"\\boxed{\\tfrac{3}{4}}", "3/4", true},
                {"\\boxed{1/2}", "\\frac{1}{2}", true},
                {"\\boxed{0.5}", "\\frac{1}{2}", true},  // by value
                {"\\boxed{-\\frac{1}{2}}", "-0.5", true},
                {"\\boxed{\\left( 1, 2 \\right)}", "(1,2)", true},
                {"\\boxed{1,000}", "1000", true},
                {"\\boxed{(1,2)}", "(12)", false},  // a pair, not a thousands comma
                {"\\boxed{3.0}", "3", true},
                {"\\boxed{90^\\circ}", "90", true},
                {"\\boxed{90^{\\circ}}", "90", true},
                {"\\boxed{50\\%}", "50", true},
                {"\\boxed{10\\text{ cm}}", "10", true},
                {"\\boxed{\\text{(A)}}", "(A)", true},
                {"\\boxed{x = 5}", "5", true},
                {"\\boxed{\\$5}", "5", true},
                {"\\boxed{\\sqrt3}", "\\sqrt{3}", true},
                {"\\boxed{ 2 x + 1 }", "2x+1", true},
                {"\\boxed{.5}", "0.5", true},
                {"\\boxed{2}", "\\boxed{3}", false},
                {"the answer is 2", "2", false},  // no \boxed
                {"\\boxed{}", "", false},
                {"\\boxed{\\frac{1}{0}}", "\\frac{2}{0}", false},
                {"final: \\boxed{1} wait, \\boxed{2}", "2", true},  // the last one
            });
}

TEST(ExactRewardTest, Cases) {
  auto r = Make("exact");
  Check(*r, {
                {"Paris", "Paris", true},
                {"  Paris\n", "Paris ", true},
                {"paris", "Paris", false},
                {"Paris.", "Paris", false},
                {"", "", true},
            });
  EXPECT_FALSE(r->Score("  ", "").well_formed);
}

TEST(RegexRewardTest, Cases) {
  auto r = Make("regex", "<answer>\\s*(.*?)\\s*</answer>");
  Check(*r, {
                {"<answer>42</answer>", "42", true},
                {"<answer> 42 </answer>", "42", true},
                {"<answer>1</answer> oops <answer>42</answer>", "42", true},  // last match
                {"<answer>41</answer>", "42", false},
                {"42", "42", false},
                {"<answer>héllo</answer>", "héllo", true},
            });
  auto whole = Make("regex", "[0-9]+");
  EXPECT_TRUE(whole->Score("a 1 b 42", "42").correct);
}

TEST(RegexRewardTest, CatastrophicPatternIsBounded) {
  auto r = Make("regex", "(a+)+$");
  std::string s(40, 'a');
  s += "b";
  EXPECT_FALSE(r->Score(s, "a").correct);  // hits the match limit, no hang
}

TEST(RewardOptionsTest, Errors) {
  RewardOptions o;
  o.type = "bleu";
  EXPECT_NE(VerifiableReward::Create(o).status().message().find("reward.type"), std::string::npos);
  o.type = "regex";
  EXPECT_NE(VerifiableReward::Create(o).status().message().find("reward.pattern: required"), std::string::npos);
  o.pattern = "(unclosed";
  EXPECT_NE(VerifiableReward::Create(o).status().message().find("reward.pattern: bad regular expression"),
            std::string::npos);
  o.type = "gsm8k";
  o.pattern = "x";
  EXPECT_FALSE(VerifiableReward::Create(o).ok());
  o.pattern = "";
  o.format_reward = -1;
  EXPECT_FALSE(VerifiableReward::Create(o).ok());
}

TEST(FormatPatternTest, ThinkTags) {
  auto r = Make("gsm8k", "", 0.5, "(?s)^<think>.*</think>");
  auto a = r->Score("<think>3+4</think> #### 7", "#### 7");
  EXPECT_TRUE(a.well_formed);
  EXPECT_DOUBLE_EQ(a.reward, 1.5);
  auto b = r->Score("#### 7", "#### 7");
  EXPECT_FALSE(b.well_formed);
  EXPECT_DOUBLE_EQ(b.reward, 1.0);
}

}  // namespace
}  // namespace tandem::rl
