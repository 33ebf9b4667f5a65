// Curriculum learning by a data metric: the analyzer's index files and the sampler (see
// data_sampling.hpp, docs/data-efficiency.md).
#include "hpct/engine/data_sampling.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <utility>

#include "hpct/core/error.hpp"
#include "hpct/core/json_config.hpp"
#include "hpct/core/report.hpp"
#include "hpct/core/rng.hpp"

namespace hpct::engine {

void MetricCurriculumConfig::validate(const std::string& file) const {
  if (!enabled) return;
  const std::string& key = schedule.key;
  auto bad = [&](const std::string& k, const std::string& what, const std::string& fix = "") {
    throw Error("'" + key + "." + k + "' " + what, Error::Context{file, key + "." + k, fix});
  };
  if (difficulty_type != "value" && difficulty_type != "percentile")
    bad("difficulty_type", "is '" + printable(difficulty_type) + "'; DeepSpeed takes value or percentile");
  if (clustering_type != "schedule_based" && clustering_type != "single_cluster")
    bad("clustering_type", "is '" + printable(clustering_type) + "'; DeepSpeed takes schedule_based or single_cluster");
  if (index_to_sample_path.empty())
    bad("index_to_sample_path", "is required: the analyzer's file (analyze_data --output-prefix ...)",
        "run analyze_data with this run's data flags; it prints the two paths");
  if (index_to_metric_path.empty())
    bad("index_to_metric_path", "is required: the analyzer's file (analyze_data --output-prefix ...)",
        "run analyze_data with this run's data flags; it prints the two paths");
  if (difficulty_type == "percentile" && (schedule.min_difficulty < 1 || schedule.max_difficulty > 100))
    bad("max_difficulty", "must lie in 1..100 for percentile difficulty (min " + std::to_string(schedule.min_difficulty) +
                              ", max " + std::to_string(schedule.max_difficulty) + ")");
  if (schedule.max_difficulty < schedule.min_difficulty)
    bad("max_difficulty", "= " + std::to_string(schedule.max_difficulty) + " is below min_difficulty " +
                              std::to_string(schedule.min_difficulty));
}

// ---- index files ----

namespace {
template <class T>
void write_file(const std::string& path, const std::vector<T>& v, const nlohmann::json& header) {
  write_file_atomic(path + ".bin", std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T)));
  write_json_file(path + ".json", header);
}

template <class T>
std::vector<T> read_file(const std::string& path, nlohmann::json* header, const char* contents) {
  *header = JsonSection::load_file(path + ".json");
  const std::string name = path + ".json";
  if (!header->is_object() || header->value("format", "") != "hpct-metric-index-1" ||
      header->value("contents", "") != contents || !(*header)["samples"].is_number_unsigned())
    throw file_error(name, std::string("is not an analyze_data ") + contents + " header",
                     "give the paths analyze_data printed (without .bin / .json)");
  const size_t n = (*header)["samples"].get<size_t>();
  std::ifstream f(path + ".bin", std::ios::binary | std::ios::ate);
  if (!f) throw file_error(path + ".bin", "cannot be opened");
  const auto bytes = static_cast<size_t>(f.tellg());
  if (bytes != n * sizeof(T))
    throw file_error(path + ".bin", "holds " + std::to_string(bytes) + " bytes; its header says " + std::to_string(n) +
                                        " samples (" + std::to_string(n * sizeof(T)) + " bytes): the file is damaged");
  std::vector<T> v(n);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(bytes));
  if (!f) throw file_error(path + ".bin", "could not be read");
  return v;
}
}  // namespace

std::pair<std::string, std::string> write_metric_index(const std::string& prefix, const std::string& metric,
                                                       const std::vector<double>& values, nlohmann::json header) {
  std::vector<int64_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return values[a] < values[b]; });
  std::vector<double> sorted(values.size());
  for (size_t i = 0; i < order.size(); ++i) sorted[i] = values[order[i]];
  header["format"] = "hpct-metric-index-1";
  header["metric"] = metric;
  header["samples"] = values.size();
  const std::string s = prefix + "_" + metric + "_index_to_sample", m = prefix + "_" + metric + "_index_to_metric";
  header["contents"] = "index_to_sample";
  write_file(s, order, header);
  header["contents"] = "index_to_metric";
  write_file(m, sorted, header);
  return {s, m};
}

MetricIndex read_metric_index(const std::string& sample_path, const std::string& metric_path) {
  MetricIndex ix;
  nlohmann::json mh;
  ix.order = read_file<int64_t>(sample_path, &ix.header, "index_to_sample");
  ix.sorted = read_file<double>(metric_path, &mh, "index_to_metric");
  nlohmann::json a = ix.header, b = mh;
  a.erase("contents"), b.erase("contents");
  if (a != b)
    throw file_error(metric_path + ".json", "describes another analysis than " + sample_path + ".json",
                     "give the two paths of one analyze_data run");
  const size_t n = ix.order.size();
  std::vector<char> seen(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t s = ix.order[i];
    if (s < 0 || (size_t)s >= n || seen[s]++)
      throw file_error(sample_path + ".bin", "is not a permutation of the " + std::to_string(n) + " samples (entry " +
                                                 std::to_string(i) + " = " + std::to_string(s) + "): the file is damaged");
    if (!std::isfinite(ix.sorted[i]) || (i > 0 && ix.sorted[i] < ix.sorted[i - 1]))
      throw file_error(metric_path + ".bin", "is not finite and ascending at entry " + std::to_string(i) + ": the file is damaged");
  }
  return ix;
}

std::unique_ptr<CurriculumSampler> open_curriculum_sampler(const MetricCurriculumConfig& mc, size_t samples,
                                                           int seq_length, uint64_t seed, const std::string& split,
                                                           long long global_batch) {
  MetricIndex ix = read_metric_index(mc.index_to_sample_path, mc.index_to_metric_path);
  const nlohmann::json& h = ix.header;
  const std::string file = mc.index_to_sample_path + ".json";
  const bool same = h.value("samples", (size_t)0) == samples && h.value("seq_length", 0) == seq_length &&
                    h.value("seed", (uint64_t)0) == seed && h.value("split", std::string()) == split;
  if (!same)
    throw file_error(file, "was made for " + std::to_string(h.value("samples", (size_t)0)) + " samples of " +
                               std::to_string(h.value("seq_length", 0)) + " tokens (seed " +
                               std::to_string(h.value("seed", (uint64_t)0)) + ", split " + h.value("split", std::string()) +
                               "); this run's training set has " + std::to_string(samples) + " of " +
                               std::to_string(seq_length) + " (seed " + std::to_string(seed) + ", split " + split + ")",
                     "run analyze_data with this run's data flags (--split, --seq-length, --seed, --train-iters, batch sizes)");
  if (h.value("metric", std::string()) != mc.metric)
    throw file_error(file, "holds the metric '" + h.value("metric", std::string()) + "', the ds_config's block is '" +
                               mc.metric + "'", "name the block after the metric, or give that metric's files");
  return std::make_unique<CurriculumSampler>(mc, std::move(ix), seed, global_batch);
}

// ---- the sampler ----

CurriculumSampler::CurriculumSampler(const MetricCurriculumConfig& cfg, MetricIndex index, uint64_t seed,
                                     long long global_batch)
    : cfg_(cfg), index_(std::move(index)), seed_(mix_seed(seed, 0x6375727269)), global_batch_(global_batch) {}

size_t CurriculumSampler::count_allowed(int d) const {
  const size_t n = index_.order.size();
  if (cfg_.clustering_type == "single_cluster") return n;
  if (cfg_.difficulty_type == "value")  // metric <= d
    return static_cast<size_t>(std::upper_bound(index_.sorted.begin(), index_.sorted.end(), double(d)) - index_.sorted.begin());
  // percentile: DeepSpeed's sample_per_percentile = N // max_percentile, all N at the maximum
  const int maxp = cfg_.schedule.max_difficulty;
  if (d >= maxp) return n;
  return std::min(n, (n / static_cast<size_t>(maxp)) * static_cast<size_t>(std::max(0, d)));
}

int64_t CurriculumSampler::take(size_t c) {
  Cluster& k = clusters_[c];
  const long long size = static_cast<long long>(k.end - k.begin);
  const long long pass = k.taken / size, pos = k.taken % size;
  if (pass != k.pass) {  // a fresh shuffle of the cluster for each pass over it
    k.perm.assign(index_.order.begin() + k.begin, index_.order.begin() + k.end);
    Rng rng(mix_seed(seed_, c, static_cast<uint64_t>(pass)));
    for (size_t i = k.perm.size(); i > 1; --i) std::swap(k.perm[i - 1], k.perm[rng.below(i)]);
    k.pass = pass;
  }
  ++k.taken;
  return k.perm[pos];
}

void CurriculumSampler::step() {
  const long long it = next_++;
  const int d = difficulty(it);
  if (!started_ || d != last_difficulty_) {
    const size_t now = std::max(allowed_, count_allowed(d));
    if (now > allowed_) {  // the newly allowed samples (none: no cluster)
      Cluster c;
      c.begin = allowed_;
      c.end = now;
      clusters_.push_back(std::move(c));
    }
    allowed_ = now;
    last_difficulty_ = d;
    started_ = true;
  }
  if (clusters_.empty()) {
    const std::string why =
        cfg_.difficulty_type == "value"
            ? "no training sample has " + cfg_.metric + " <= " + std::to_string(d) + " (the smallest is " +
                  (index_.sorted.empty() ? std::string("none") : std::to_string(index_.sorted.front())) + ")"
            : "percentile " + std::to_string(d) + " allows no training sample (" + std::to_string(index_.order.size()) +
                  " samples, " + std::to_string(index_.order.size() / std::max(1, cfg_.schedule.max_difficulty)) +
                  " per point of max_difficulty " + std::to_string(cfg_.schedule.max_difficulty) + ")";
    throw Error("'" + cfg_.schedule.key + ".min_difficulty': " + why,
                Error::Context{"", cfg_.schedule.key + ".min_difficulty", "raise min_difficulty"});
  }
  batch_.resize(global_batch_);
  for (long long k = 0; k < global_batch_; ++k) {
    // The cluster of position k: proportional to the clusters' sizes (DeepSpeed's weighted choice).
    Rng rng(mix_seed(seed_, static_cast<uint64_t>(it), static_cast<uint64_t>(k)));
    size_t u = rng.below(allowed_), c = 0;
    while (u >= clusters_[c].end - clusters_[c].begin) u -= clusters_[c].end - clusters_[c].begin, ++c;
    batch_[k] = take(c);
  }
}

const std::vector<int64_t>& CurriculumSampler::batch(long long it) {
  if (it < next_ - 1) throw Error("curriculum sampler: iteration " + std::to_string(it) + " asked after " + std::to_string(next_ - 1));
  while (next_ <= it) step();
  return batch_;
}

}  // namespace hpct::engine
