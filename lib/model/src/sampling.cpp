// Next-token choice (see sampling.hpp).
#include "hpct/model/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "hpct/core/error.hpp"

namespace hpct::model {

void SamplingConfig::validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature))
    throw config_error("--temperature", "--temperature must be >= 0 (0: greedy), got " + std::to_string(temperature));
  if (top_k < 0) throw config_error("--top-k", "--top-k must be >= 0 (0: no cut), got " + std::to_string(top_k));
  if (!(top_p > 0 && top_p <= 1))
    throw config_error("--top-p", "--top-p must be in (0, 1] (1: no cut), got " + std::to_string(top_p));
}

double token_logprob(const float* logits, int V, int32_t id) {
  int32_t best = 0;
  for (int i = 1; i < V; ++i)
    if (logits[i] > logits[best]) best = i;
  double z = 0;
  for (int i = 0; i < V; ++i) z += std::exp(double(logits[i]) - double(logits[best]));
  return double(logits[id]) - double(logits[best]) - std::log(z);
}

int32_t sample_token(const float* logits, int V, const SamplingConfig& c, std::mt19937_64& rng, double* logprob) {
  int32_t best = 0;
  for (int i = 1; i < V; ++i)
    if (logits[i] > logits[best]) best = i;
  int32_t id = best;
  if (c.temperature > 0) {
    std::vector<int32_t> ids(V);
    std::iota(ids.begin(), ids.end(), 0);
    // Most likely first; ties by id, so the order (and the draw) does not depend on the sort.
    auto more = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    const int k = c.top_k > 0 ? std::min(c.top_k, V) : V;
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), more);
    ids.resize(k);
    std::vector<double> p(k);
    double z = 0;
    for (int i = 0; i < k; ++i) z += (p[i] = std::exp((double(logits[ids[i]]) - double(logits[ids[0]])) / c.temperature));
    int keep = k;
    if (c.top_p < 1) {  // the smallest prefix whose mass reaches top_p (at least one id)
      double mass = 0;
      for (int i = 0; i < k; ++i) {
        mass += p[i] / z;
        if (mass >= c.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    double total = 0;
    for (int i = 0; i < keep; ++i) total += p[i];
    const double u = double(rng() >> 11) * 0x1.0p-53 * total;  // uniform in [0, total)
    double acc = 0;
    id = ids[keep - 1];
    for (int i = 0; i < keep; ++i) {
      acc += p[i];
      if (u < acc) {
        id = ids[i];
        break;
      }
    }
  }
  if (logprob) *logprob = token_logprob(logits, V, id);
  return id;
}

}  // namespace hpct::model
