// Single-process training on a synthetic task: 2-digit addition with the
// char tokenizer ("<bos>12+34=" -> "046<eos>", fixed width), the tiny model of
// configs/models/tiny.yaml, AdamW, loss only on the answer. The loss must go
// down and greedy exact-match accuracy on held-out problems must go up
// within a bounded number of steps (seeded; well under 60 s on 2 cores).
// One compute thread by default: the model is tiny and the test machine is
// shared (TANDEM_TRAIN_THREADS, _STEPS, _BATCH, _LR override for
// experiments).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "kernels/backends.h"
#include "worker/model/model.h"
#include "worker/model/model_commands.h"
#include "worker/model/param_layout.h"
#include "worker/model/tokenizer.h"
#include "worker/rollout/engine.h"

namespace tandem::model {
namespace {

struct Problem {
  std::vector<int32_t> prompt, answer;  // answer ends with EOS
};

// Fixed-width digits ("07+45=" -> "052"), so every digit has a fixed
// position.
Problem MakeProblem(int a, int b, const CharTokenizer& tok) {
  char buf[32];
  Problem p;
  p.prompt = {tok.bos()};
  std::snprintf(buf, sizeof(buf), "%02d+%02d=", a, b);
  for (int32_t id : tok.Encode(buf)) p.prompt.push_back(id);
  std::snprintf(buf, sizeof(buf), "%03d", a + b);
  p.answer = tok.Encode(buf);
  p.answer.push_back(tok.eos());
  return p;
}

double Accuracy(rollout::RolloutEngine& gen, FlatParamProvider& pp, const std::vector<Problem>& eval,
                const ModelConfig& cfg) {
  std::vector<rollout::RolloutRequest> prompts;
  for (size_t i = 0; i < eval.size(); ++i) prompts.push_back({eval[i].prompt, -1, i});
  rollout::RolloutOptions so;
  so.sampling.greedy = true;
  so.max_new_tokens = 5;
  so.stop_ids.assign(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());
  auto res = gen.Generate(prompts, so, pp);
  EXPECT_TRUE(res.ok()) << res.status();
  int ok = 0;
  for (size_t i = 0; i < eval.size(); ++i) ok += res->sequences[i].tokens == eval[i].answer;
  return static_cast<double>(ok) / eval.size();
}

TEST(TrainTest, TwoDigitAdditionLearns) {
  const auto t0 = std::chrono::steady_clock::now();
  auto cfg = LoadModelConfigFile(std::string(TANDEM_SOURCE_DIR) + "/configs/models/tiny.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const CharTokenizer tok = CharTokenizer::Default();
  auto ops =
      kernels::MakeCpuOps(std::getenv("TANDEM_TRAIN_THREADS") ? std::atoi(std::getenv("TANDEM_TRAIN_THREADS")) : 1);
  Model model(*cfg, ops.get());
  const size_t n = model.layout().total_floats();
  std::vector<float> p(n), g(n), m(n, 0.f), v(n, 0.f);
  model.InitParams(2024, p.data());
  FlatParamProvider pp(model.layout(), p.data(), g.data());
  rollout::RolloutEngine gen(*cfg, ops.get());

  // Held-out problems: every pair with (a * 7 + b) % 10 == 0 is never trained on.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> digit(0, 99);
  auto held_out = [](int a, int b) { return (a * 7 + b) % 10 == 0; };
  std::vector<Problem> eval;
  while (eval.size() < 200) {
    const int a = digit(rng), b = digit(rng);
    if (held_out(a, b)) eval.push_back(MakeProblem(a, b, tok));
  }
  const double acc0 = Accuracy(gen, pp, eval, *cfg);

  const int steps = std::getenv("TANDEM_TRAIN_STEPS") ? std::atoi(std::getenv("TANDEM_TRAIN_STEPS")) : 600;
  const int batch = std::getenv("TANDEM_TRAIN_BATCH") ? std::atoi(std::getenv("TANDEM_TRAIN_BATCH")) : 64;
  const float peak_lr = std::getenv("TANDEM_TRAIN_LR") ? std::atof(std::getenv("TANDEM_TRAIN_LR")) : 3e-3f;
  std::vector<float> logp, dlogp, mask;
  double first_loss = 0, last_loss = 0;
  for (int step = 1; step <= steps; ++step) {
    Batch b;
    mask.clear();
    for (int i = 0; i < batch; ++i) {
      int a, c;
      do {
        a = digit(rng);
        c = digit(rng);
      } while (held_out(a, c));
      Problem pr = MakeProblem(a, c, tok);
      std::vector<int32_t> seq = pr.prompt;
      seq.insert(seq.end(), pr.answer.begin(), pr.answer.end());
      b.AddSequence(seq);
      // Row r predicts seq[r+1]: train on the answer tokens only.
      for (size_t r = 0; r + 1 < seq.size(); ++r) mask.push_back(r + 1 >= pr.prompt.size() ? 1.f : 0.f);
    }
    const int T = b.num_tokens();
    logp.resize(T);
    dlogp.resize(T);
    ASSERT_TRUE(model.ForwardLogprobs(b, pp, logp.data()).ok());
    const float loss = SftLoss(logp, mask, dlogp.data());
    std::fill(g.begin(), g.end(), 0.f);
    ASSERT_TRUE(model.Backward(dlogp.data(), pp).ok());
    const double norm = std::sqrt(ops->sum_squares(g.data(), n));
    if (norm > 1.0) ops->scale(g.data(), static_cast<float>(1.0 / norm), n);
    const float warm = std::min(1.f, step / 30.f);
    const float lr = peak_lr * warm * (0.1f + 0.9f * 0.5f * (1.f + std::cos(3.14159265f * step / steps)));
    ops->adamw_step(p.data(), g.data(), m.data(), v.data(), n, lr, 0.9f, 0.98f, 1e-8f, 0.01f, step);
    if (step <= 10) first_loss += loss / 10;
    if (step > steps - 10) last_loss += loss / 10;
    if (step % 50 == 0) {
      std::printf("step %d loss %.4f (%.1f s)\n", step, loss,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      std::fflush(stdout);
    }
  }
  const double acc1 = Accuracy(gen, pp, eval, *cfg);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[train] %d steps x %d problems: loss %.3f -> %.3f, held-out exact match %.3f -> %.3f, %.1f s\n", steps,
              batch, first_loss, last_loss, acc0, acc1, secs);
  EXPECT_LT(last_loss, 0.5 * first_loss);
  EXPECT_LT(acc0, 0.05);
  EXPECT_GT(acc1, 0.8);
  EXPECT_LT(secs, 60.0);
}

}  // namespace
}  // namespace tandem::model
