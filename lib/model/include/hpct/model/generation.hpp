// hpct/model/generation.hpp — continuing prompts with the cached decoder (model/decoder.hpp): sampled
// (greedy, temperature, top-k, top-p, a repetition penalty) or by beam search, as Megatron's
// text generation and Hugging Face's generate() do. One component serves the generate app's command
// line, its interactive mode and its HTTP server.
//
// Sampling: the prompts of a batch are read (prefill) one by one, then decoded together: each step
// runs one new token of every live sequence in one batched pass, so the weights are read once per
// step for the whole batch. A sequence stops at the end-of-document token ("eod", kept as its last
// id), at max_new tokens ("max_new_tokens"), at the model's last position ("length"), or when the
// caller's stop check says so after a token ("stop_sequence": its stop strings, which need the
// tokenizer, stay with the caller). Each sample draws from its own stream, seeded from (seed,
// its stream index), so its text does not depend on how the samples are batched.
// Repetition penalty (CTRL's, Hugging Face's repetition_penalty): before sampling, the logit of
// every id already in the prompt or the output is divided by the penalty where positive and
// multiplied by it where negative (1: off). Reported log-probabilities stay the model's own.
// Beam search (deterministic; temperature, top-k and top-p do not apply): beam_width hypotheses;
// each step keeps the best 2 x width continuations of all of them by summed log-probability; a
// continuation ending at end-of-document becomes a finished hypothesis (when among the best
// width), scored sum log p / generated_length^length_penalty (Hugging Face's score, the length
// counting the end-of-document token); the search ends when width hypotheses are finished and no
// live one can beat the worst of them, or at max_new / the last position, where the live ones are
// finished too. The hypotheses continue in 2 x width decoder slots (each step copies the kept
// ones' caches).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hpct/model/decoder.hpp"
#include "hpct/model/sampling.hpp"

namespace hpct::model {

struct GenerationConfig {
  SamplingConfig sampling;
  int max_new = 32;                 // tokens to generate per prompt
  double repetition_penalty = 1.0;  // 1: off; > 1 discourages ids already seen
  int beam_width = 1;               // > 1: beam search
  double length_penalty = 1.0;      // beam score exponent on the generated length
  bool cache = true;                // false: every position again for every new token (comparisons)
  uint64_t seed = 1234;
  int32_t eod = -1;                 // the end-of-document id (-1: none)
  /// Throws config_error naming the flag of a value out of range.
  void validate() const;
};

struct Sample {
  std::vector<int32_t> prompt, ids;  // ids: the generated tokens (an end-of-document one included)
  std::vector<double> logprobs;      // each generated token's log-probability under the model
  std::string stop = "max_new_tokens";  // eod, max_new_tokens, length or stop_sequence
  double score = 0;                  // beam search: the hypothesis's score (see above)
  uint64_t stream = 0;               // sampling: which stream of --seed it draws from
};

struct GenerationStats {
  double prefill_s = 0, decode_s = 0;
  long long prefill_tokens = 0, new_tokens = 0;
  GenerationStats& operator+=(const GenerationStats& o);
};

/// After each generated token (not an end-of-document one): true stops the sample there.
using StopCheck = std::function<bool(const Sample&)>;

class Generator {
 public:
  /// params: Gpt::layout_for(cfg)'s flat fp32 parameters in host memory (outliving the generator);
  /// vocab: the real vocabulary (ids at or above it are never chosen); slots: decoder sequences,
  /// the most samples decoded together (at least 2 x beam width for a beam search).
  Generator(const GptConfig& cfg, const float* params, int vocab, int slots);

  /// Continues each sample's prompt (slots() at a time); a null stop check stops only at eod,
  /// max_new and the last position.
  GenerationStats sample(std::vector<Sample>& samples, const GenerationConfig& c, const StopCheck& stop = {});
  /// Beam search from one prompt: up to beam_width finished hypotheses, best score first.
  std::vector<Sample> beam_search(const std::vector<int32_t>& prompt, const GenerationConfig& c,
                                  GenerationStats* stats = nullptr);

  int slots() const { return dec_.sequences(); }
  int vocab() const { return vocab_; }
  size_t cache_bytes() const { return dec_.cache_bytes(); }
  const GptConfig& config() const { return dec_.config(); }

 private:
  Decoder dec_;
  int vocab_, Vp_;
};

/// Repetition penalty on one row of logits (V ids): each distinct id of seen[0..n) below V once.
void apply_repetition_penalty(float* logits, int V, const int32_t* seen, size_t n, double penalty);

}  // namespace hpct::model
