// The data analyzer's metrics (DeepSpeed's DataAnalyzer for GPT: vocabulary rarity and a length),
// computed over a training set's samples, MPI-parallel over sample ranges. See data_sampling.hpp.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "hpct/core/error.hpp"
#include "hpct/core/report.hpp"
#include "hpct/engine/data/data_sampling.hpp"

namespace hpct::engine {

namespace {
// Rank r's samples of n: a contiguous block.
std::pair<size_t, size_t> block(size_t n, int r, int p) { return {n * r / p, n * (r + 1) / p}; }

// Calls f(i, tokens) for this rank's samples, in quarters: rank 0 prints a progress line with an
// ETA after each (core/report.hpp's Progress).
template <class F>
void for_my_samples(const io::GptDataset& data, const comm::Communicator& comm, const char* what, F f) {
  const auto [b, e] = block(data.size(), comm.rank(), comm.size());
  std::vector<int32_t> buf(data.seq_length() + 1);
  Progress progress(4, 0, comm.rank() == 0 ? stdout : nullptr);
  for (int q = 0; q < 4; ++q) {
    const auto [qb, qe] = block(e - b, q, 4);
    for (size_t i = b + qb; i < b + qe; ++i) {
      data.get(i, buf.data());
      f(i, buf);
    }
    progress.done(std::string("analyze_data: ") + what + ": rank 0's samples to " + std::to_string(qe) + " of " +
                  std::to_string(e - b));
  }
}
}  // namespace

std::vector<double> analyze_metric(const io::GptDataset& data, const std::string& metric, size_t vocab_size,
                                   const comm::Communicator& comm) {
  const size_t n = data.size(), S = data.seq_length();
  std::vector<double> values(n, 0.0);  // this rank's samples filled; summed over ranks at the end
  if (metric == "seqlen") {
    for_my_samples(data, comm, "seqlen", [&](size_t i, const std::vector<int32_t>&) {
      values[i] = double(std::min(S, data.first_document_tokens(i)));
    });
  } else if (metric == "vocab_rarity") {
    // Counts of every token over the training samples' input tokens (the S the model sees).
    std::vector<double> counts(vocab_size, 0.0);
    for_my_samples(data, comm, "token counts", [&](size_t, const std::vector<int32_t>& tok) {
      for (size_t t = 0; t < S; ++t) {
        if (tok[t] < 0 || (size_t)tok[t] >= vocab_size)
          throw Error("analyze_data: token id " + std::to_string(tok[t]) + " outside the vocabulary [0, " +
                      std::to_string(vocab_size) + "): the dataset was written with another tokenizer");
        counts[tok[t]] += 1;
      }
    });
    comm.allreduce_sum(counts.data(), counts.size());
    double total = 0;
    for (double c : counts) total += c;
    std::vector<double> cost(vocab_size, 0.0);  // -ln p(token)
    for (size_t v = 0; v < vocab_size; ++v)
      if (counts[v] > 0) cost[v] = -std::log(counts[v] / total);
    for_my_samples(data, comm, "vocab_rarity", [&](size_t i, const std::vector<int32_t>& tok) {
      double r = 0;
      for (size_t t = 0; t < S; ++t) r += cost[tok[t]];
      values[i] = r;
    });
  } else {
    throw config_error("--metrics", "unknown metric '" + printable(metric) + "'", "use vocab_rarity or seqlen");
  }
  comm.allreduce_sum(values.data(), values.size());  // each sample is nonzero on one rank only (x + 0 = x)
  return values;
}

}  // namespace hpct::engine
