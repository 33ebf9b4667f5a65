// analyze_data — DeepSpeed's DataAnalyzer for curriculum learning by a data metric: computes a metric
// for every sample of the training set a pretrain_gpt / pretrain_moe run will draw from, over MPI
// ranks, and writes the index files its ds_config names (docs/data-efficiency.md).
//
//   mpirun -np 2 analyze_data --metrics vocab_rarity,seqlen --output-prefix data/brown_analysis
//       @inputs/gpt-tiny.args --data-path data/brown_text_document --vocab-file ... --merge-file ...
//       --split 949,50,1 --train-iters 400
//
// Every other flag is pretrain_gpt's: give the data flags of the training run (data path, split,
// --seq-length, --seed, --train-iters and the global batch) so the samples are the run's.
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hpct/comm/mpi.hpp"
#include "hpct/core/cli.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/report.hpp"
#include "hpct/core/timer.hpp"
#include "hpct/engine/checkpoint/checkpointer.hpp"
#include "hpct/engine/data/data.hpp"
#include "hpct/engine/config/preflight.hpp"
#include "hpct/engine/data/data_sampling.hpp"
#include "hpct/engine/config/train_config.hpp"

using namespace hpct;

namespace {
const char* kHelp =
    "usage: analyze_data --output-prefix PREFIX [--metrics vocab_rarity,seqlen] [--json FILE] [pretrain_gpt data flags]\n"
    "\n"
    "Computes curriculum metrics for every sample of a run's training set (MPI-parallel over the\n"
    "samples) and writes, per metric, PREFIX_<metric>_index_to_sample.{bin,json} and\n"
    "PREFIX_<metric>_index_to_metric.{bin,json}: the paths to give as index_to_sample_path and\n"
    "index_to_metric_path in the ds_config's data_efficiency.data_sampling.curriculum_learning\n"
    ".curriculum_metrics.<metric> block.\n"
    "\n"
    "  --output-prefix PREFIX  where the index files go\n"
    "  --metrics LIST          comma-separated: vocab_rarity (sum over the sample's input tokens of\n"
    "                          -ln(count/total), counts over every training sample) and/or seqlen (the\n"
    "                          tokens of the sample's first document piece); default vocab_rarity\n"
    "  --json FILE             a machine-readable summary (metrics, files, min/median/max, seconds)\n"
    "  -h, --help              this text\n"
    "\n"
    "Every other flag is pretrain_gpt's (@FILE too); give the training run's data flags: --data-path,\n"
    "--vocab-file, --merge-file, --split, --seq-length, --seed, --train-iters and the batch sizes, so\n"
    "the samples (and their count) are the ones the run draws. The run checks this from the headers.\n";
}  // namespace

static int run(int argc, char** argv) {
  comm::Communicator world = comm::Communicator::world();
  const bool root = world.rank() == 0;
  std::string prefix, metrics = "vocab_rarity", json;
  engine::TrainConfig cfg;
  // Its own flags and pretrain_gpt's on one parser: one error names every bad flag of the line.
  const bool go = engine::parse_args(std::vector<std::string>(argv + 1, argv + argc), cfg, [&](cli::Parser& p) {
    p.flag("--output-prefix", 1, [&](const std::string& v) { prefix = v; });
    p.flag("--metrics", 1, [&](const std::string& v) { metrics = v; });
    p.flag("--json", 1, [&](const std::string& v) { json = v; });
  });
  if (!go) {
    if (root) std::cout << kHelp;
    return 0;
  }
  if (prefix.empty()) throw config_error("--output-prefix", "--output-prefix PREFIX is required (where the index files go)");
  std::vector<std::string> names;
  std::stringstream ss(metrics);
  for (std::string m; std::getline(ss, m, ',');)
    if (!m.empty()) {
      if (m != "vocab_rarity" && m != "seqlen")
        throw config_error("--metrics", "unknown metric '" + printable(m) + "' in --metrics", "use vocab_rarity and/or seqlen");
      names.push_back(m);
    }
  if (names.empty()) throw config_error("--metrics", "--metrics names no metric", "use vocab_rarity and/or seqlen");
  if (cfg.mock_data) throw config_error("--mock-data", "analyze_data reads a real dataset", "give --data-path PREFIX");
  if (cfg.data_path.size() != 1 || !cfg.train_data_path.empty())
    throw config_error(cfg.data_path.size() > 1 ? "--data-path" : "--train-data-path", "analyze_data indexes one dataset, not a blend",
                       "give --data-path PREFIX (the curriculum's dataset)");
  // The outputs are checked before the work, not found unwritable after it. The prefix's folder is
  // created first (DeepSpeed's DataAnalyzer makes its save_path), by rank 0, every rank then checking it.
  if (const std::string dir = std::filesystem::path(prefix).parent_path().string(); !dir.empty()) {
    std::string err = root ? comm::error_text_of([&] {
      struct stat st {};
      if (::stat(dir.c_str(), &st) != 0) {
        try {
          engine::Checkpointer::make_directory(dir);
        } catch (const Error& e) {
          throw config_error("--output-prefix", "--output-prefix " + prefix + ": cannot create its folder " + dir + ": " +
                                                    e.message());
        }
      }
    }) : "";
    world.bcast_string(err, 0);
    if (!err.empty()) throw Error::relayed(err);
  }
  engine::check_file_output(prefix, "--output-prefix");
  engine::check_file_output(json, "--json");
  engine::TrainData data = engine::build_train_data(cfg, 1, false);
  const auto* train = dynamic_cast<const io::GptDataset*>(data.train.get());
  if (!train) throw Error("analyze_data: the training set is not an indexed dataset");
  if (root)
    std::cout << "analyze_data: " << train->size() << " training samples of " << cfg.model.max_seq_length
              << " tokens (" << cfg.data_path[0] << ", split " << cfg.split << ", seed " << cfg.seed << ") on "
              << world.size() << " ranks\n" << std::flush;
  nlohmann::json summary = {{"samples", train->size()}, {"ranks", world.size()}, {"metrics", nlohmann::json::object()}};
  for (const auto& m : names) {
    Timer t;
    std::vector<double> v = engine::analyze_metric(*train, m, (size_t)cfg.model.vocab_size, world);
    nlohmann::json header = {{"seq_length", cfg.model.max_seq_length}, {"seed", cfg.seed},
                             {"data_path", cfg.data_path[0]}, {"split", cfg.split},
                             {"global_batch_size", cfg.global_batch}, {"train_iters", cfg.train_iters}};
    std::pair<std::string, std::string> paths;
    // Rank 0 writes; a failure there stops every rank with its message.
    std::string err = root ? comm::error_text_of([&] { paths = engine::write_metric_index(prefix, m, v, header); }) : "";
    world.bcast_string(err, 0);
    if (!err.empty()) throw Error::relayed(err);  // err already names its rank
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    const double secs = t.seconds();
    if (root) {
      std::printf("analyze_data: %s: min %.4f, median %.4f, max %.4f over %zu samples in %.2f s\n", m.c_str(),
                  sorted.front(), sorted[sorted.size() / 2], sorted.back(), sorted.size(), secs);
      std::printf("analyze_data: wrote %s.{bin,json} and %s.{bin,json}\n", paths.first.c_str(), paths.second.c_str());
      summary["metrics"][m] = {{"index_to_sample_path", paths.first}, {"index_to_metric_path", paths.second},
                               {"min", sorted.front()}, {"median", sorted[sorted.size() / 2]}, {"max", sorted.back()},
                               {"seconds", secs}};
    }
  }
  if (root && !json.empty()) write_json_file(json, summary);
  return 0;
}

int main(int argc, char** argv) {
  if (hpct::print_version_if_asked("analyze_data", argc, argv)) return 0;
  comm::Environment env(&argc, &argv);
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    // Flag and data checks run alike on every rank: one line, from rank 0.
    if (comm::Communicator::world().rank() == 0) std::fprintf(stderr, "analyze_data: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "analyze_data: error: [rank %d] %s\n", comm::Communicator::world().rank(), e.what());
    comm::Environment::abort(1);
  }
}
