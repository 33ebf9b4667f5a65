// Curriculum learning by a data metric: the analyzer's index files and the sampler (see
// data_sampling.hpp, docs/data-efficiency.md).
#include "hpct/engine/data/data_sampling.hpp"

#include <sys/stat.h>

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
  struct stat st {};
  if (::stat((path + ".bin").c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw file_error(path + ".bin", "is not a regular file", "give the paths analyze_data printed (without .bin / .json)");
  std::ifstream f(path + ".bin", std::ios::binary | std::ios::ate);
  if (!f) throw file_error(path + ".bin", "cannot be opened");
  const auto bytes = static_cast<size_t>(f.tellg());
  // Compared by division: n * sizeof(T) wraps for n near 2^61 (2^61 + 38527 samples "fit" 308216 bytes).
  if (bytes % sizeof(T) != 0 || n != bytes / sizeof(T))
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

namespace {
// Whether the analysis's data_path (as analyze_data was given it) names this run's dataset: the same
// .idx file where the recorded path resolves from here, else the same final name (a relative path
// recorded in another directory cannot be resolved).
bool same_dataset(const std::string& recorded, const std::string& run) {
  if (recorded.empty() || run.empty()) return true;
  struct stat a {}, b {};
  if (::stat((recorded + ".idx").c_str(), &a) == 0 && ::stat((run + ".idx").c_str(), &b) == 0)
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  auto base = [](const std::string& p) { return p.substr(p.find_last_of('/') == std::string::npos ? 0 : p.find_last_of('/') + 1); };
  return base(recorded) == base(run);
}
}  // namespace

std::unique_ptr<CurriculumSampler> open_curriculum_sampler(const std::vector<MetricCurriculumConfig>& cfgs,
                                                           size_t samples, int seq_length, uint64_t seed,
                                                           const std::string& split, long long global_batch,
                                                           const std::string& data_path) {
  std::vector<MetricIndex> indexes;
  for (const MetricCurriculumConfig& mc : cfgs) {
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
    const std::string recorded = h.contains("data_path") && h["data_path"].is_string() ? h["data_path"].get<std::string>() : "";
    if (!same_dataset(recorded, data_path))
      throw file_error(file, "was made from the dataset " + recorded + "; this run trains on " + data_path,
                       "run analyze_data on this run's --data-path");
    if (h.value("metric", std::string()) != mc.metric)
      throw file_error(file, "holds the metric '" + h.value("metric", std::string()) + "', the ds_config's block is '" +
                                 mc.metric + "'", "name the block after the metric, or give that metric's files");
    indexes.push_back(std::move(ix));
  }
  return std::make_unique<CurriculumSampler>(cfgs, std::move(indexes), seed, global_batch);
}

// ---- the sampler ----

CurriculumSampler::CurriculumSampler(const MetricCurriculumConfig& cfg, MetricIndex index, uint64_t seed,
                                     long long global_batch)
    : CurriculumSampler(std::vector<MetricCurriculumConfig>{cfg}, [&] {
        std::vector<MetricIndex> v;
        v.push_back(std::move(index));
        return v;
      }(), seed, global_batch) {}

CurriculumSampler::CurriculumSampler(std::vector<MetricCurriculumConfig> cfgs, std::vector<MetricIndex> indexes,
                                     uint64_t seed, long long global_batch)
    : cfgs_(std::move(cfgs)), indexes_(std::move(indexes)), seed_(mix_seed(seed, 0x6375727269)), global_batch_(global_batch) {
  if (cfgs_.empty() || cfgs_.size() != indexes_.size()) throw Error("curriculum sampler: one index per metric");
  const size_t n = indexes_[0].order.size();
  for (size_t m = 1; m < indexes_.size(); ++m)
    if (indexes_[m].order.size() != n)
      throw file_error(cfgs_[m].index_to_sample_path + ".json",
                       "has " + std::to_string(indexes_[m].order.size()) + " samples, metric '" + cfgs_[0].metric +
                           "' has " + std::to_string(n) + ": the two describe different training sets",
                       "analyze every metric with the same data flags");
  counts_.assign(cfgs_.size(), 0);
  if (cfgs_.size() > 1) {
    rank_.assign(cfgs_.size(), std::vector<int64_t>(n));
    for (size_t m = 0; m < cfgs_.size(); ++m)
      for (size_t i = 0; i < n; ++i) rank_[m][(size_t)indexes_[m].order[i]] = (int64_t)i;
    in_.assign(n, 0);
  }
}

std::vector<int> CurriculumSampler::difficulties(long long it) const {
  std::vector<int> d;
  for (const auto& c : cfgs_) d.push_back(c.schedule.difficulty_at(it + 1));
  return d;
}

size_t CurriculumSampler::count_allowed(size_t m, int d) const {
  const MetricCurriculumConfig& cfg = cfgs_[m];
  const MetricIndex& ix = indexes_[m];
  const size_t n = ix.order.size();
  if (cfg.clustering_type == "single_cluster") return n;
  if (cfg.difficulty_type == "value")  // metric <= d
    return static_cast<size_t>(std::upper_bound(ix.sorted.begin(), ix.sorted.end(), double(d)) - ix.sorted.begin());
  // percentile: DeepSpeed's sample_per_percentile = N // max_percentile, all N at the maximum
  const int maxp = cfg.schedule.max_difficulty;
  if (d >= maxp) return n;
  return std::min(n, (n / static_cast<size_t>(maxp)) * static_cast<size_t>(std::max(0, d)));
}

void CurriculumSampler::admit(const std::vector<int>& d) {
  std::vector<size_t> prev = counts_;
  for (size_t m = 0; m < cfgs_.size(); ++m) counts_[m] = std::max(counts_[m], count_allowed(m, d[m]));
  Cluster c;
  if (cfgs_.size() == 1) {  // the newly allowed part of the sorted order
    const auto& order = indexes_[0].order;
    c.members.assign(order.begin() + (std::ptrdiff_t)prev[0], order.begin() + (std::ptrdiff_t)counts_[0]);
  } else {
    // A sample becomes allowed when the last of its metrics allows it: it is in some metric's newly
    // allowed range. Those candidates that every metric allows now, in the first metric's order.
    std::vector<int64_t> fresh;
    for (size_t m = 0; m < cfgs_.size(); ++m)
      for (size_t i = prev[m]; i < counts_[m]; ++i) {
        const int64_t s = indexes_[m].order[i];
        if (in_[(size_t)s]) continue;
        bool all = true;
        for (size_t k = 0; k < cfgs_.size() && all; ++k) all = (size_t)rank_[k][(size_t)s] < counts_[k];
        if (all) in_[(size_t)s] = 1, fresh.push_back(s);
      }
    std::sort(fresh.begin(), fresh.end(), [&](int64_t a, int64_t b) { return rank_[0][(size_t)a] < rank_[0][(size_t)b]; });
    c.members = std::move(fresh);
  }
  if (c.members.empty()) return;
  allowed_ += c.members.size();
  clusters_.push_back(std::move(c));
}

int64_t CurriculumSampler::take(size_t c) {
  Cluster& k = clusters_[c];
  const long long size = static_cast<long long>(k.members.size());
  const long long pass = k.taken / size, pos = k.taken % size;
  if (pass != k.pass) {  // a fresh shuffle of the cluster for each pass over it
    k.perm = k.members;
    Rng rng(mix_seed(seed_, c, static_cast<uint64_t>(pass)));
    for (size_t i = k.perm.size(); i > 1; --i) std::swap(k.perm[i - 1], k.perm[rng.below(i)]);
    k.pass = pass;
  }
  ++k.taken;
  return k.perm[pos];
}

void CurriculumSampler::step() {
  const long long it = next_++;
  const std::vector<int> d = difficulties(it);
  if (!started_ || d != last_difficulty_) {
    admit(d);
    last_difficulty_ = d;
    started_ = true;
  }
  if (clusters_.empty()) {
    std::string why;
    for (size_t m = 0; m < cfgs_.size(); ++m) {
      const MetricCurriculumConfig& cfg = cfgs_[m];
      const MetricIndex& ix = indexes_[m];
      why += (why.empty() ? "" : "; ") +
             (cfg.difficulty_type == "value"
                  ? std::to_string(counts_[m]) + " training samples have " + cfg.metric + " <= " + std::to_string(d[m]) +
                        " (the smallest is " + (ix.sorted.empty() ? std::string("none") : std::to_string(ix.sorted.front())) + ")"
                  : "percentile " + std::to_string(d[m]) + " of " + cfg.metric + " allows " + std::to_string(counts_[m]) +
                        " training samples (" + std::to_string(ix.order.size()) + " samples, " +
                        std::to_string(ix.order.size() / std::max(1, cfg.schedule.max_difficulty)) +
                        " per point of max_difficulty " + std::to_string(cfg.schedule.max_difficulty) + ")");
    }
    const std::string key = cfgs_[0].schedule.key + ".min_difficulty";
    throw Error("'" + key + "': no training sample is allowed at the start: " + why +
                    (cfgs_.size() > 1 ? " (a sample must be allowed by every metric)" : ""),
                Error::Context{"", key, "raise min_difficulty"});
  }
  batch_.resize(global_batch_);
  for (long long k = 0; k < global_batch_; ++k) {
    // The cluster of position k: proportional to the clusters' sizes (DeepSpeed's weighted choice).
    Rng rng(mix_seed(seed_, static_cast<uint64_t>(it), static_cast<uint64_t>(k)));
    size_t u = rng.below(allowed_), c = 0;
    while (u >= clusters_[c].members.size()) u -= clusters_[c].members.size(), ++c;
    batch_[k] = take(c);
  }
}

const std::vector<int64_t>& CurriculumSampler::batch(long long it) {
  if (it < next_ - 1) throw Error("curriculum sampler: iteration " + std::to_string(it) + " asked after " + std::to_string(next_ - 1));
  while (next_ <= it) step();
  return batch_;
}

}  // namespace hpct::engine
