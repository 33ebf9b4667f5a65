// Documents packed in a sample (gpt.hpp: reset_attention_mask, reset_position_ids, eod_token).
//
// - A packed sample is its documents run alone: one sample holding documents of 5, 4 and 3 tokens
//   (the first two ending in the end-of-document token) gives the summed loss and the summed
//   gradients of the three documents each run as a sample of its own (the targets that cross a
//   document's end ignored in both), with and without recomputation. Tolerance: loss 1e-5
//   relative, every gradient within 2e-5 x max|g| (the test_tensor_parallel bound: the same fp32
//   sums, grouped by differently shaped GEMMs; seen ~1e-7).
// - Nothing crosses a document's end: changing the tokens of the first document leaves the loss of
//   the second's targets bitwise unchanged (masked keys contribute exact zeros), also with a
//   random-LTD layer running on a subset of the tokens; without reset_attention_mask it changes
//   (the check can fail).
// - Without the end-of-document token the flags are refused naming the flag.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/backend.hpp"
#include "hpct/model/gpt.hpp"

using namespace hpct;

namespace {

constexpr int kEod = 0;

model::GptConfig tiny(int layers = 2) {
  model::GptConfig c;
  c.num_layers = layers;
  c.hidden_size = 16;
  c.num_heads = 2;
  c.max_seq_length = 12;
  c.vocab_size = 23;
  c.vocab_multiple = 8;
  c.init_std = 0.2;
  c.reset_attention_mask = c.reset_position_ids = true;
  c.eod_token = kEod;
  return c;
}

struct StepResult {
  double loss = 0;
  std::vector<float> grads;
};

StepResult step(model::Gpt& m, const std::vector<float>& p, const std::vector<int32_t>& tok, const std::vector<int32_t>& tgt,
         int B, int T) {
  StepResult r;
  std::vector<float> params = p;
  r.grads.assign(p.size(), 0.0f);
  model::FlatParamStore st(m.layout(), params.data(), r.grads.data());
  r.loss = m.forward_backward(st, tok.data(), tgt.data(), B, T, 1.0f);
  return r;
}

}  // namespace

TEST(Documents, PackedSampleEqualsItsDocumentsAlone) {
  const std::vector<int> lens = {5, 4, 3};
  const int T = 12;
  std::vector<int32_t> tok(T), tgt(T);
  for (int i = 0; i < T; ++i) tok[i] = 1 + (i * 7 + 3) % 22, tgt[i] = 1 + (i * 5 + 1) % 22;  // no eod inside
  tok[4] = tok[8] = kEod;            // documents end at 4 and 8
  tgt[4] = tgt[8] = tgt[11] = -1;    // a document's last token predicts nothing of its own
  for (bool recompute : {false, true}) {
    model::Gpt m(tiny(), kernels::Precision::fp32, recompute);
    std::vector<float> p(m.layout().numel());
    m.init_params(p.data(), 42);
    const StepResult packed = step(m, p, tok, tgt, 1, T);
    StepResult alone;
    alone.grads.assign(p.size(), 0.0f);
    int start = 0;
    for (int len : lens) {
      const std::vector<int32_t> dt(tok.begin() + start, tok.begin() + start + len),
          dg(tgt.begin() + start, tgt.begin() + start + len);
      const StepResult r = step(m, p, dt, dg, 1, len);
      alone.loss += r.loss;
      for (size_t i = 0; i < p.size(); ++i) alone.grads[i] += r.grads[i];
      start += len;
    }
    EXPECT_NEAR(packed.loss, alone.loss, 1e-5 * std::fabs(alone.loss)) << "recompute " << recompute;
    float gmax = 0;
    for (float g : alone.grads) gmax = std::max(gmax, std::fabs(g));
    ASSERT_GT(gmax, 0.0f);
    for (const auto& t : m.layout().tensors())
      for (size_t i = t.offset; i < t.offset + t.numel; ++i)
        ASSERT_NEAR(packed.grads[i], alone.grads[i], 2e-5 * gmax) << t.name << "[" << i - t.offset << "] recompute " << recompute;
  }
}

TEST(Documents, NothingCrossesADocumentsEnd) {
  const int B = 2, T = 12;
  std::vector<int32_t> tok(B * T), tgt(B * T, -1);
  for (int i = 0; i < B * T; ++i) tok[i] = 1 + (i * 7 + 3) % 22;
  for (int b = 0; b < B; ++b) {
    tok[b * T + 5] = kEod;                                     // document 1: positions 0..5
    for (int t = 6; t < T; ++t) tgt[b * T + t] = 1 + (t * 5 + b) % 22;  // only document 2's targets count
  }
  std::vector<int32_t> changed = tok;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < 5; ++t) changed[b * T + t] = 1 + (changed[b * T + t] + 9) % 22;
  for (int ltd : {0, 1}) {
    for (bool reset : {true, false}) {
      model::GptConfig c = tiny(3);
      c.reset_attention_mask = reset;
      model::Gpt m(c, kernels::Precision::fp32, false);
      if (ltd) {
        m.set_random_ltd_layers({1});
        m.set_kept_tokens(7, 5, 100);  // 7 of the 12 tokens in layer 1
      }
      std::vector<float> p(m.layout().numel());
      m.init_params(p.data(), 42);
      const double a = step(m, p, tok, tgt, B, T).loss, b = step(m, p, changed, tgt, B, T).loss;
      if (reset)
        EXPECT_EQ(a, b) << "another document's tokens reached this one (random-LTD " << ltd << ")";
      else
        EXPECT_NE(a, b) << "without reset_attention_mask the documents see each other";
    }
  }
}

TEST(Documents, NeedTheEndOfDocumentToken) {
  for (bool attention : {true, false}) {
    model::GptConfig c = tiny();
    c.reset_attention_mask = attention;
    c.reset_position_ids = !attention;
    c.eod_token = -1;
    try {
      model::Gpt m(c, kernels::Precision::fp32, false);
      FAIL() << "accepted without an end-of-document token";
    } catch (const hpct::Error& e) {
      EXPECT_NE(std::string(e.what()).find(attention ? "--reset-attention-mask" : "--reset-position-ids"),
                std::string::npos)
          << e.what();
    }
  }
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kernels::BackendScope backend;
  return RUN_ALL_TESTS();
}
