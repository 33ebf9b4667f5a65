// What the GPU-against-CPU model tests share (test_gpt_cuda, test_tensor_parallel_cuda): the tiny
// model, start weights on the host and on the device (LoRA's zero factor moved off zero), and the
// per-tensor gradient check.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "hpct/kernels/ops_backend.hpp"
#include "hpct/model/gpt.hpp"

namespace hpct::test {

/// The tiny GPT of the GPU-against-CPU tests: 2 layers, hidden 32, 4 heads, 16 tokens, vocabulary
/// 100 padded to 128 (padding columns exercised; at T = 2 the last slice ends in padding).
inline model::GptConfig tiny_gpt(int tensor_parallel = 1) {
  model::GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_heads = 4;
  c.max_seq_length = 16;
  c.vocab_size = 100;
  c.vocab_multiple = 64;
  c.tensor_parallel = tensor_parallel;
  return c;
}

/// LoRA: a factor that starts at zero moved off it, so that both factors get a gradient.
inline void move_lora_off_zero(const ParamLayout& layout, std::vector<float>& params) {
  for (const auto& t : layout.tensors())
    if (t.name.find(".lora_") != std::string::npos && params[t.offset] == 0.0f && params[t.offset + t.numel - 1] == 0.0f)
      for (size_t i = 0; i < t.numel; ++i) params[t.offset + i] = 0.05f * static_cast<float>(static_cast<int>(i % 7) - 3);
}

/// The CPU model's start weights (seed; LoRA's zero factor moved off zero) twice: on the host with
/// zero gradients and a store, and in a backend's memory with zero gradients and a store.
struct WeightsOnBoth {
  std::vector<float> params, grads;
  model::FlatParamStore host;
  kernels::BackendBuffer dparams, dgrads;
  model::FlatParamStore device;
  WeightsOnBoth(const model::Gpt& cpu, const model::Gpt& gpu, kernels::OpsBackend& be, uint64_t seed)
      : params(init(cpu, seed)),
        grads(params.size(), 0.0f),
        host(cpu.layout(), params.data(), grads.data()),
        dparams(be, params.size() * sizeof(float)),
        dgrads(be, params.size() * sizeof(float)),
        device((be.copy_from_host(dparams.as<void>(), params.data(), params.size() * sizeof(float)),
                be.zero(dgrads.as<void>(), params.size() * sizeof(float)), gpu.layout()),
               dparams.as<float>(), dgrads.as<float>()) {}
  static std::vector<float> init(const model::Gpt& m, uint64_t seed) {
    std::vector<float> p(m.layout().numel());
    m.init_params(p.data(), seed);
    move_lora_off_zero(m.layout(), p);
    return p;
  }
};

/// Every tensor's largest difference within tol of the larger of its own largest gradient and
/// 1e-3 of the model's (a tensor of small gradients judged at its own scale).
inline void expect_gradients_close(const ParamLayout& layout, const std::vector<float>& got,
                                   const std::vector<float>& want, double tol, const std::string& where) {
  double scale = 0;
  for (float x : want) scale = std::max(scale, static_cast<double>(std::fabs(x)));
  ASSERT_GT(scale, 0.0) << where;
  for (const auto& t : layout.tensors()) {
    double worst = 0, own = 0;
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
      own = std::max(own, static_cast<double>(std::fabs(want[i])));
    }
    EXPECT_LE(worst, tol * std::max(own, 1e-3 * scale)) << t.name << " on " << where;
  }
}

}  // namespace hpct::test
