// The tiny GPT the engine tests train (mock data, a few steps, seconds on 2 cores), one
// definition for the data-parallel, ZeRO and checkpoint tests.
#pragma once
#include "hpct/engine/config/train_config.hpp"

namespace hpct::test {

/// global_batch must divide by every rank count the test runs with (12: 1..4; 6: 1..3).
inline engine::TrainConfig tiny_gpt(int iters, int layers, int global_batch, int hidden = 32) {
  engine::TrainConfig c;
  c.model.num_layers = layers;
  c.model.hidden_size = hidden;
  c.model.num_heads = 4;
  c.model.max_seq_length = 16;
  c.model.vocab_size = 101;
  c.model.vocab_multiple = 8;
  c.micro_batch = 1;
  c.global_batch = global_batch;
  c.train_iters = iters;
  c.lr = 1e-3;
  c.min_lr = 1e-4;
  c.lr_warmup_iters = 1;
  c.lr_style = engine::LrStyle::cosine;
  c.mock_data = true;
  c.eval_iters = 0;
  c.log_interval = 1000;
  return c;
}

}  // namespace hpct::test
