// hpct/kernels/dropout.hpp — dropout masks that are a pure function of what an element IS, not of
// where it is computed: shared by the CPU ops and the CUDA kernels (host and device code).
//
// What it is: a counter-based mask. An element keeps its value (times 1/(1-p)) unless a 64-bit hash
// of (site key, global sample, position code, column) falls below p * 2^32. The site key mixes the
// run seed with the layer and the site (embedding, attention probabilities, attention output, MLP
// output); the global sample is the sample's index in the run's sample order (the trainer's
// `first` + b, as for MoE routing). So a sample gets the same mask on 1 or 8 ranks, at any data-,
// tensor- or sequence-parallel layout, in a recompute pass and after a resume: nothing is stored
// and no generator state advances.
// What it is not: Megatron's mask bits (those come from CUDA's Philox streams and are layout
// dependent); the statistics are the same (each element kept independently with 1 - p).
// Trade-off: one 64-bit mix per element (a few multiplies, vectorised) against keeping a mask
// buffer; backward regenerates the mask instead of reading one.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define HPCT_DROPOUT_FN __host__ __device__ __forceinline__
#else
#define HPCT_DROPOUT_FN inline
#endif

namespace hpct::kernels {

/// One dropout site of one micro-batch. Rows of a (rows, C) buffer are tokens: row r is micro-batch
/// row first_row + r, i.e. sample first_sample + (first_row + r) / T at position (first_row + r) % T.
/// Attention probabilities: the row of sample b, head h, query i uses the position code
/// (head0 + h) << 32 | i, and the column is the key j.
struct Dropout {
  float p = 0.0f;              // probability of dropping, 0 <= p < 1; 0: the op is the identity
  uint64_t key = 0;            // the site's key (dropout_site_key)
  long long first_sample = 0;  // global index of micro-batch sample 0
  int T = 1;                   // tokens per sample in this micro-batch
  long long first_row = 0;     // micro-batch row of buffer row 0 (sequence parallelism: this rank's first)
  int head0 = 0;               // attention: this rank's first head (tensor parallelism)

  bool on() const { return p > 0.0f; }
  /// 1/(1-p), rounded once to fp32 on the host so every backend multiplies by the same number.
  float scale() const { return on() ? 1.0f / (1.0f - p) : 1.0f; }
  /// Elements whose 32 hash bits are below this are dropped.
  uint32_t threshold() const {
    const double t = static_cast<double>(p) * 4294967296.0;
    return t >= 4294967295.0 ? 0xffffffffu : static_cast<uint32_t>(t);
  }
};

// splitmix64, as core/rng.hpp's, here again because device code calls it (rng.hpp's is host-only).
HPCT_DROPOUT_FN uint64_t dropout_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// The key of one row of masks: (site key, global sample, position code).
HPCT_DROPOUT_FN uint64_t dropout_row_key(uint64_t key, long long sample, uint64_t code) {
  return dropout_mix(dropout_mix(key ^ dropout_mix(static_cast<uint64_t>(sample))) ^ code);
}

/// Whether column `col` of the row keyed `row_key` keeps its value.
HPCT_DROPOUT_FN bool dropout_keep(uint64_t row_key, uint64_t col, uint32_t threshold) {
  return static_cast<uint32_t>(dropout_mix(row_key + col * 0xd1b54a32d192ed03ULL) >> 32) >= threshold;
}

/// The position code of attention row (head, query i).
HPCT_DROPOUT_FN uint64_t dropout_attention_code(int head, int i) {
  return (static_cast<uint64_t>(head) << 32) | static_cast<uint32_t>(i);
}

/// A site's key from the run seed, the layer (-1: the embedding) and the site inside the layer.
enum class DropoutSite : uint64_t { embedding = 1, attention_probs = 2, attention_out = 3, mlp_out = 4 };
HPCT_DROPOUT_FN uint64_t dropout_site_key(uint64_t seed, int layer, DropoutSite site) {
  return dropout_mix(dropout_mix(seed ^ 0x64726f706f7574ULL) ^ (static_cast<uint64_t>(layer + 1) << 8 |
                                                                static_cast<uint64_t>(site)));
}

}  // namespace hpct::kernels
