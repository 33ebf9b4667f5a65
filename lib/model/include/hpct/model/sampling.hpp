// hpct/model/sampling.hpp — choosing the next token from a row of logits: greedy, temperature,
// top-k, top-p (nucleus), as Megatron's and Hugging Face's generate do.
//
// Order (Hugging Face's): logits / temperature, keep the top_k largest (0: all), then the smallest
// set of the most likely whose probability reaches top_p (1: all), renormalise, draw. Temperature
// 0 is greedy (the largest logit; the lowest id on a tie). Only ids below the real vocabulary are
// ever chosen: the padding columns of the head are never drawn.
// The draw uses a caller-owned generator, so a stream per prompt seeded from (--seed, prompt index)
// gives the same text whatever the batching.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace hpct::model {

struct SamplingConfig {
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // 0: no top-k cut
  double top_p = 1.0;        // 1: no nucleus cut
  /// Throws config_error naming --temperature, --top-k or --top-p for a value out of range.
  void validate() const;
};

/// The chosen id in [0, V) from logits[0..V); *logprob (if not null) receives its log-probability
/// under the model's own distribution (softmax of the raw logits over the V ids: temperature 1,
/// no cut), as inference servers report it.
int32_t sample_token(const float* logits, int V, const SamplingConfig& c, std::mt19937_64& rng, double* logprob);

/// The ids 0..V-1 by logit, largest first, ties (+0 and -0 among them) by the smaller id: the order
/// sample_token draws in. A radix sort, so a step over a 50k vocabulary is not held by a comparison sort.
std::vector<int32_t> most_likely_first(const float* logits, int V);

/// The log-probability of id under the softmax of logits[0..V) (max-subtracted, summed in double):
/// the model's own, as sample_token reports it.
double token_logprob(const float* logits, int V, int32_t id);

}  // namespace hpct::model
