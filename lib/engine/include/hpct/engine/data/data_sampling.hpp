// hpct/engine/data/data_sampling.hpp — curriculum learning by a data metric (DeepSpeed's
// data_efficiency.data_sampling.curriculum_learning with an analyzed metric; docs/data-efficiency.md).
//
// The analyzer (apps/analyze_data) computes one value per training sample (vocab_rarity: the sum
// over the sample's input tokens of -ln(count(token) / total) with counts over every training
// sample's input tokens; seqlen: the tokens of the sample's first document piece, at most
// --seq-length) and writes two index files per metric: index_to_sample (the sample ids in
// ascending metric order, ties by id) and index_to_metric (their values), each PATH.bin (int64 /
// float64, little-endian) beside PATH.json, which names the metric and the training set it was made
// for (sample count, sequence length, seed, data path, split).
//
// The sampler is DeepSpeed's DeepSpeedDataSampler for one metric: the difficulty d(s) follows the
// curriculum schedule (CurriculumConfig's pacing, s = iteration + 1); whenever it changes, the
// samples newly allowed become a cluster (value: metric in (d_prev, d]; percentile: the next
// N / max_difficulty per percentile point of the sorted order, all of the rest at the last point).
// Each sample of a global batch comes from a cluster chosen with probability proportional to its
// size, taking that cluster's next sample in a shuffled order that is reshuffled when exhausted.
// single_cluster puts every sample in one cluster. Several metrics (DeepSpeed's curriculum_metrics
// with more than one data metric): each follows its own schedule, a sample is allowed when every
// metric allows it, and the new cluster is what all of them allow now and was not allowed before (in
// the first metric's order). Unlike DeepSpeed's numpy state, every draw is a
// function of (seed, iteration, position, cluster, pass), so the batches do not depend on the rank
// layout and a resume replays the cluster positions from iteration 0 (O(samples drawn), no state in
// the checkpoint) to the exact next sample.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpct/comm/mpi.hpp"
#include "hpct/engine/data/curriculum.hpp"
#include "hpct/io/gpt_dataset.hpp"

namespace hpct::engine {

struct MetricCurriculumConfig {
  bool enabled = false;
  std::string metric;                  // the curriculum_metrics key (vocab_rarity, seqlen, or a user name)
  std::string index_to_sample_path, index_to_metric_path;
  std::string difficulty_type = "value";           // value | percentile
  std::string clustering_type = "schedule_based";  // schedule_based | single_cluster
  CurriculumConfig schedule;  // the pacing (min/max difficulty, schedule_type, schedule_config); key = its path
  /// Throws naming the file and key for values the sampler cannot use.
  void validate(const std::string& file) const;
};

/// One metric's values for a training set, in the analyzer's files.
struct MetricIndex {
  nlohmann::json header;             // metric, samples, seq_length, seed, data_path, split, ...
  std::vector<int64_t> order;        // sample ids, ascending metric (ties by id)
  std::vector<double> sorted;        // their values
};
/// Writes PREFIX_<metric>_index_to_sample.{bin,json} and ..._index_to_metric.{bin,json} from one value
/// per sample; returns the two paths (without extension) for the ds_config.
std::pair<std::string, std::string> write_metric_index(const std::string& prefix, const std::string& metric,
                                                       const std::vector<double>& values, nlohmann::json header);
/// Reads the two files; throws hpct::Error naming the file for a missing, short or inconsistent one.
MetricIndex read_metric_index(const std::string& index_to_sample_path, const std::string& index_to_metric_path);

/// Collective over comm: `metric` ("vocab_rarity" or "seqlen", as described above) of every sample of
/// `data`, on every rank; each rank reads a contiguous block of the samples.
std::vector<double> analyze_metric(const io::GptDataset& data, const std::string& metric, size_t vocab_size,
                                   const comm::Communicator& comm);

class CurriculumSampler;
/// Reads each metric's index files, checks their headers against a training set of `samples`
/// samples of seq_length tokens drawn with (seed, split) from the dataset `data_path` ("": not
/// checked), and returns the sampler; throws naming the file.
std::unique_ptr<CurriculumSampler> open_curriculum_sampler(const std::vector<MetricCurriculumConfig>& cfgs,
                                                           size_t samples, int seq_length, uint64_t seed,
                                                           const std::string& split, long long global_batch,
                                                           const std::string& data_path = "");

class CurriculumSampler {
 public:
  /// index must describe a training set of `samples` samples; throws naming the file otherwise.
  CurriculumSampler(const MetricCurriculumConfig& cfg, MetricIndex index, uint64_t seed, long long global_batch);
  /// Several metrics of one training set (cfgs[i] with indexes[i]; the same sample count).
  CurriculumSampler(std::vector<MetricCurriculumConfig> cfgs, std::vector<MetricIndex> indexes, uint64_t seed,
                    long long global_batch);
  /// The dataset sample ids of iteration it's global batch. Iterations are asked in order; asking for a
  /// later one first replays the ones before it (a resume).
  const std::vector<int64_t>& batch(long long it);
  /// The difficulty iteration it draws under, and the samples allowed then (tests, logs).
  int difficulty(long long it) const { return cfgs_[0].schedule.difficulty_at(it + 1); }
  /// Every metric's difficulty at iteration it, in the order of metrics().
  std::vector<int> difficulties(long long it) const;
  const std::vector<MetricCurriculumConfig>& metrics() const { return cfgs_; }
  size_t allowed() const { return allowed_; }
  size_t clusters() const { return clusters_.size(); }

 private:
  size_t count_allowed(size_t m, int difficulty) const;  // samples of metric m's sorted order a difficulty allows
  void admit(const std::vector<int>& d);                 // the cluster the difficulties d newly allow, if any
  void step();                                           // draws iteration next_'s batch
  struct Cluster {
    std::vector<int64_t> members;  // sample ids, in the first metric's order
    long long taken = 0;           // samples drawn from it so far
    std::vector<int64_t> perm;     // its shuffled order for the current pass
    long long pass = -1;
  };
  int64_t take(size_t c);

  std::vector<MetricCurriculumConfig> cfgs_;
  std::vector<MetricIndex> indexes_;
  std::vector<std::vector<int64_t>> rank_;  // several metrics: each sample's position in metric m's order
  std::vector<size_t> counts_;              // per metric: the prefix of its order its difficulty allows
  std::vector<char> in_;                    // several metrics: allowed so far
  uint64_t seed_;
  long long global_batch_;
  std::vector<Cluster> clusters_;
  size_t allowed_ = 0;
  std::vector<int> last_difficulty_;
  bool started_ = false;
  long long next_ = 0;  // the next iteration step() draws
  std::vector<int64_t> batch_;
};

}  // namespace hpct::engine
