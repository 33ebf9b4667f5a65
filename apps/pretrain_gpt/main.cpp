// pretrain_gpt — trains a GPT model over MPI ranks (data parallel), Megatron-DeepSpeed style.
// Thin: parse flags, build datasets, hand over to hpct::engine::Trainer, write the summary.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "hpct/comm/mpi.hpp"
#include "hpct/comm/process_grid.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/sysinfo.hpp"
#include "hpct/core/units.hpp"
#include "hpct/engine/data.hpp"
#include "hpct/engine/trainer.hpp"
#include "hpct/kernels/ops.hpp"

using namespace hpct;

// Errors before training starts come from config and data checks that every rank runs alike, so
// every rank fails together and can exit normally. After that, an error may be one rank's alone
// and its peers would wait forever in a collective: then the job is aborted.
static bool g_setup_phase = true;

static int run(int argc, char** argv) {
  comm::Communicator world = comm::Communicator::world();
  engine::TrainConfig cfg;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!engine::parse_args(args, cfg)) {
    if (world.rank() == 0) std::cout << engine::help_text("pretrain_gpt");
    return 0;
  }
  kernels::BackendScope backend;
  comm::ProcessGrid grid(world, 1, 1);
  const bool root = world.rank() == 0;

  // Data first: a real dataset fixes the vocabulary size.
  engine::TrainData data = engine::build_train_data(cfg, grid.dp().size(), root);
  cfg.finalize(grid.dp().size());

  engine::Trainer trainer(cfg, grid);
  // Loading is collective and its checks fail on every rank alike: still the setup phase.
  trainer.load_checkpoint();
  g_setup_phase = false;
  if (root) {
    auto mem = trainer.memory_report();
    std::cout << "> " << cfg.model.describe() << "\n"
              << "> parameters: " << trainer.model().layout().numel() << "  (" << grid.describe() << ")\n"
              << "> backend: " << kernels::backend_description() << "\n"
              << "> precision: " << (cfg.precision == engine::PrecisionMode::fp32 ? "fp32" : cfg.precision == engine::PrecisionMode::bf16 ? "bf16 mixed (fp32 master)" : "fp16 mixed (fp32 master, dynamic loss scale)")
              << ", micro batch " << cfg.micro_batch << ", global batch " << cfg.global_batch << ", grad accumulation "
              << cfg.grad_accum << "\n"
              << "> memory per rank (host): parameters " << format_bytes(mem.params) << ", gradients "
              << format_bytes(mem.grads) << ", optimizer states " << format_bytes(mem.optimizer) << "\n";
    if (data.unigram_ppl > 0) std::printf("> unigram baseline perplexity on the validation split: %.2f\n", data.unigram_ppl);
    std::cout << std::flush;
  }
  engine::TrainSummary s = trainer.train(*data.train, data.valid.get());
  if (root) {
    double final_val = s.val_losses.empty() ? NAN : s.val_losses.back().second;
    std::printf("> training done: iterations %lld to %lld in %.1f s, %.1f tokens/s, peak resident memory per rank %s\n",
                s.start_iteration, s.last_iteration, s.seconds, s.tokens_per_second,
                format_bytes((double)s.peak_rss_bytes).c_str());
    if (!s.val_losses.empty()) {
      std::printf("> final validation loss %.4f, perplexity %.2f", final_val, std::exp(final_val));
      if (data.unigram_ppl > 0) std::printf(" (unigram baseline %.2f: %.2fx lower)", data.unigram_ppl, data.unigram_ppl / std::exp(final_val));
      std::printf("\n");
    }
    nlohmann::json summary = {{"type", "summary"},
                              {"iterations", s.last_iteration},
                              {"start_iteration", s.start_iteration},
                              {"exit_reason", s.exit_reason},
                              {"checkpoints_saved", s.saved},
                              {"total_seconds", s.seconds},
                              {"tokens_per_second", s.tokens_per_second},
                              {"final_lm_loss", s.steps.empty() ? NAN : s.steps.back().lm_loss},
                              {"skipped_iterations", s.skipped_iterations},
                              {"world_size", world.size()},
                              {"peak_rss_bytes_per_rank", s.peak_rss_per_rank},
                              {"parameters", trainer.model().layout().numel()}};
    if (!s.val_losses.empty()) {
      summary["final_val_loss"] = final_val;
      summary["final_val_ppl"] = std::exp(final_val);
    }
    if (data.unigram_ppl > 0) summary["unigram_val_ppl"] = data.unigram_ppl;
    if (!cfg.metrics_file.empty()) {
      std::ofstream m(cfg.metrics_file, std::ios::app);
      m << summary.dump() << "\n";
    }
    if (!cfg.json_summary.empty()) {
      std::ofstream j(cfg.json_summary);
      if (!j) throw file_error(cfg.json_summary, "cannot write the JSON summary");
      j << summary.dump(2) << "\n";
    }
  }
  // A stop on SIGUSR1/SIGTERM saved a checkpoint: a documented code tells the job script to requeue.
  return s.exit_reason == "signal" ? engine::kExitSavedOnSignal : 0;
}

int main(int argc, char** argv) {
  comm::Environment env(&argc, &argv);
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    if (!g_setup_phase || comm::Communicator::world().rank() == 0)
      std::fprintf(stderr, "pretrain_gpt: error: %s\n", e.what());
    if (!g_setup_phase) comm::Environment::abort(1);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pretrain_gpt: error: [rank %d] %s\n", comm::Communicator::world().rank(), e.what());
    comm::Environment::abort(1);
  }
}
