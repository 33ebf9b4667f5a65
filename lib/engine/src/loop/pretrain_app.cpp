// The pretraining apps' shared body (pretrain_gpt, pretrain_moe): parse flags, build the process
// grid and datasets, hand over to the Trainer, report what was held and sent, write the summary.
// One copy for every app, so a report line or a summary key means the same in each. See pretrain_app.hpp.
#include "hpct/engine/loop/pretrain_app.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>

#include "hpct/comm/mpi.hpp"
#include "hpct/comm/process_grid.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/report.hpp"
#include "hpct/core/sysinfo.hpp"
#include "hpct/core/units.hpp"
#include "hpct/engine/data/data.hpp"
#include "hpct/engine/checkpoint/finetune.hpp"
#include "hpct/engine/records/run_records.hpp"
#include "hpct/engine/loop/trainer.hpp"
#include "hpct/io/aio_config.hpp"
#include "hpct/kernels/ops.hpp"
#include "hpct/kernels/optim.hpp"
#include "hpct/engine/config/preflight.hpp"
#include "hpct/parallel/memory_estimate.hpp"

namespace hpct::engine {

// Errors before training starts come from config and data checks that every rank runs alike, so
// every rank fails together and can exit normally. After that, an error may be one rank's alone
// and its peers would wait forever in a collective: then the job is aborted.
static bool g_setup_phase = true;
static const char* g_prog = "pretrain_gpt";

// --estimate-memory: arithmetic only (no data, no model, no collectives). Every rank computes it
// alike, so a bad flag fails on all of them; rank 0 prints the table and writes --json.
static int estimate_memory(engine::TrainConfig cfg, bool root) {
  if (!cfg.vocab_size_given) cfg.model.vocab_size = 50257;  // what a real run's GPT-2 tokenizer sets
  const auto& e = cfg.estimate;
  auto bytes = [](double gb) { return static_cast<uint64_t>(std::llround(gb * 1e9)); };
  parallel::ClusterShape c;
  if (e.cpu_memory_gb < 0 || e.nvme_gb < 0) c = parallel::local_cluster_shape(e.gpus_per_node, ".");
  c.nodes = e.nodes;
  c.devices_per_node = e.gpus_per_node;
  c.device_bytes = bytes(e.gpu_memory_gb);
  if (e.cpu_memory_gb >= 0) c.host_bytes = bytes(e.cpu_memory_gb);
  if (e.nvme_gb >= 0) c.nvme_bytes = bytes(e.nvme_gb);
  const auto prec = cfg.precision == engine::PrecisionMode::fp32 ? parallel::StatePrecision::fp32
                                                                 : parallel::StatePrecision::mixed;
  parallel::MemoryEstimate est = parallel::estimate_memory(cfg.model, prec, c, {}, cfg.moe_ep);
  if (!root) return 0;
  Provenance prov(std::string(g_prog) + " --estimate-memory");
  std::string fitting;
  for (const auto& p : est.plans)
    if (p.fits()) fitting += (fitting.empty() ? "" : ", ") + std::to_string(p.stage) + "/" + parallel::offload_name(p.offload);
  std::cout << prov.text() << est.header_text() << est.table().text()
            << "# fits (stage/offload): " << (fitting.empty() ? "none of the " + std::to_string(est.plans.size()) + " choices" : fitting)
            << "\n" << std::flush;
  if (!cfg.json_summary.empty()) {
    nlohmann::json doc = est.json();
    doc["provenance"] = prov.json();
    write_json_file(cfg.json_summary, doc);
  }
  return 0;
}

static int run(int argc, char** argv, bool require_moe, bool finetune_app) {
  comm::Communicator world = comm::Communicator::world();
  engine::TrainConfig cfg;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!engine::parse_args(args, cfg)) {
    if (world.rank() == 0) std::cout << engine::help_text(g_prog);
    return 0;
  }
  if (world.rank() == 0)
    for (const auto& n : cfg.notes) std::cout << "> note: " << n << "\n";
  if (require_moe && !cfg.model.moe.enabled(cfg.model.num_layers))
    throw config_error("--num-experts", std::string(g_prog) + " trains mixture-of-experts models: no layer has more than one expert",
                       "give --num-experts E (E > 1; MoE goes on every --expert-interval-th layer), or run pretrain_gpt for a dense model");
  if (cfg.estimate.enabled) return estimate_memory(cfg, world.rank() == 0);
  if (finetune_app) {  // finetune: --load's weights (Megatron's --finetune), or --load-hf's
    if (cfg.load_path.empty() && cfg.load_hf.empty())
      throw config_error("--load", "finetune starts from a model", "give --load DIR (a pretraining run's checkpoint) or --load-hf DIR (GPT-2 weights)");
    if (cfg.load_hf.empty()) cfg.finetune = true;
  }
  kernels::BackendScope backend;
  comm::ProcessGrid grid(world, cfg.model.tensor_parallel, cfg.moe_ep);
  const bool root = world.rank() == 0;

  // Data first: a real dataset fixes the vocabulary size.
  engine::TrainData data = engine::build_train_data(cfg, grid.dp().size(), root);
  cfg.finalize(grid.dp().size());
  if (root) std::cout << engine::arguments_text(cfg) << std::flush;  // as Megatron prints them at start
  // Finetuning starts from weights (a requeued job from its own checkpoint instead); they may bring
  // their position table.
  engine::StartWeights start = engine::plan_start(cfg, world);
  // Before anything else large is allocated: do the model states fit this node? (Every rank checks
  // its own node; a refusal on one is everyone's.)
  const int ranks_on_node = world.node_local_size();
  comm::throw_if_any(world, comm::error_text_of([&] { engine::check_host_memory(cfg, ranks_on_node, world.size()); }));

  engine::Trainer trainer(cfg, grid);
  // Loading is collective and its checks fail on every rank alike: still the setup phase.
  // The start weights first: a resumed LoRA run's checkpoint holds its adapters on top of them.
  const std::string base = engine::load_start_weights(trainer, start, world);
  std::string loaded = trainer.load_checkpoint();
  if (loaded.empty()) loaded = base;
  if (!cfg.skip_train) trainer.prepare(*data.train);  // the curriculum's index files, checked now
  if (cfg.skip_train && loaded.empty())
    throw config_error("--skip-train", "--skip-train evaluates a trained model, but --load names no checkpoint",
                       "give --load DIR (with a `latest`) or --load FILE of a saved checkpoint");
  // The run's records: rank 0 appends this segment to the metrics file (trimming what lies past the
  // checkpoint), opens TensorBoard / CSV. Its IO errors stop every rank together.
  engine::RunRecorder records(cfg, world.rank() == 0);
  {
    engine::SegmentInfo seg;
    seg.app = g_prog;
    seg.resumed_from = trainer.iteration();
    seg.checkpoint = loaded;
    seg.hosts = world.allgather_string(node_name());
    seg.layout = {{"world_size", world.size()},
                  {"data_parallel", grid.dp().size()},
                  {"expert_parallel", grid.ep().size()},
                  {"tensor_parallel", grid.tp().size()},
                  {"zero_stage", cfg.zero.stage},
                  {"description", grid.describe()}};
    seg.config = engine::config_to_json(cfg);
    seg.evaluation_only = cfg.skip_train;
    comm::throw_if_any(world, comm::error_text_of([&] { records.begin_segment(seg); }));
  }
  g_setup_phase = false;
  // Model states each rank holds (ZeRO partitions them), gathered so rank 0 can report every rank.
  auto mem = trainer.memory_report();
  const std::vector<double> held = world.allgather(double(mem.params + mem.grads + mem.optimizer + mem.grad_shard));
  if (root) {
    std::cout << "> " << cfg.model.describe() << "\n"
              << "> parameters: " << trainer.model().layout().full_numel()
              << (grid.tp().size() > 1 ? ", " + std::to_string(trainer.model().layout().numel()) + " per tensor-parallel rank" : std::string())
              << "  (" << grid.describe() << ")\n"
              << "> backend: "
              << (cfg.device == "cuda" ? trainer.model().ops().name() + " (CUDA kernels, cuBLAS); host: " : std::string())
              << kernels::backend_description() << "\n"
              << "> attention: " << trainer.attention_kernel() << "\n"
              << "> precision: " << (cfg.precision == engine::PrecisionMode::fp32 ? "fp32" : cfg.precision == engine::PrecisionMode::bf16 ? "bf16 mixed (fp32 master)" : "fp16 mixed (fp32 master, dynamic loss scale)")
              << ", micro batch " << cfg.micro_batch << ", global batch " << cfg.global_batch << ", grad accumulation "
              << cfg.grad_accum
              << (trainer.model().keeps_half_activations() ? "; GEMM inputs kept in 16 bits" : "")
              << (trainer.model().keeps_half_pre_activations() ? "; GELU pre-activations in 16 bits" : "")
              << (trainer.model().keeps_half_logits() ? "; LM head logits in 16 bits" : "")
              << (cfg.rampup.on() ? " (batch " + engine::BatchSchedule(cfg.global_batch, (long long)cfg.micro_batch * grid.dp().size(), cfg.rampup).describe() + ")"
                                  : std::string())
              << "\n"
              << "> ZeRO stage " << cfg.zero.stage << " over " << grid.dp().size()
              << " data-parallel ranks; model states in " << (mem.states_on_device ? "GPU" : "host")
              << " memory on rank 0: parameters "
              << format_bytes(mem.params) << ", gradients " << format_bytes(mem.grads + mem.grad_shard)
              << ", optimizer states " << format_bytes(mem.optimizer) << "; per rank "
              << format_bytes(*std::min_element(held.begin(), held.end())) << " to "
              << format_bytes(*std::max_element(held.begin(), held.end())) << "\n";
    if (mem.states_on_device)
      std::cout << "> GPU-resident ZeRO: the model, the states above and the optimizer step (one fused AdamW "
                   "launch) on "
                << trainer.model().ops().name()
                << "; only the loss and the gradient norm come back to the host each step (no "
                   "zero_optimization.offload_optimizer in the config; set its device to cpu for ZeRO-Offload)"
                << (trainer.dp_collectives().empty() ? "" : "; data-parallel collectives: " + trainer.dp_collectives())
                << "\n";
    if (!mem.states_on_device)  // the AdamW step runs on the host: CPU training or ZeRO-Offload
      std::cout << "> host AdamW: " << kernels::optimizer_threads() << " thread(s) per rank, "
                << kernels::optimizer_isa() << " (--optimizer-threads, OMP_NUM_THREADS or SLURM_CPUS_PER_TASK)\n";
    if (!mem.states_on_device && cfg.device == "cuda")
      std::cout << "> ZeRO-Offload (zero_optimization.offload_optimizer.device " << cfg.zero.offload_optimizer.device
                << "): the model computes on " << trainer.model().ops().name() << " ("
                << (cfg.zero.stage <= 2 ? std::string(trainer.zero().half() ? "16-bit" : "fp32") + " parameters " +
                                              format_bytes(mem.device_params_grads) + " resident, and "
                                        : std::string())
                << "each block's fp32 working parameters and gradient there while in use; the peak is in the "
                   "summary); the states above and the optimizer step stay on the host\n"
                << (trainer.optimizer_overlap_off().empty()
                        ? "> host AdamW beside the next step's forward: each block goes to the GPU as soon as it is "
                          "updated, the forward waits only for the blocks not yet updated (the same numbers; "
                          "--no-optimizer-overlap waits for the whole step)\n"
                        : "> host AdamW before the next step's forward (" + trainer.optimizer_overlap_off() + ")\n");
    if (trainer.zero().offloaded())
      std::cout << "> NVMe offload (rank 0's swap file " << format_bytes(mem.nvme_file) << ", async IO "
                << io::engine_name(trainer.zero().swap_engine()) << "): parameters "
                << format_bytes(mem.nvme_params) << ", optimizer states " << format_bytes(mem.nvme_optimizer)
                << (trainer.zero().half() ? " (with the fp32 master weights; the 16-bit parameters are rounded from them)" : "")
                << "\n";
    if (cfg.model.lora.enabled()) {  // trainable state: the adapters' parameters, gradients, optimizer states
      const double trained = double(trainer.stored_layout().full_numel()), all = double(trainer.model().layout().full_numel());
      std::printf("> LoRA rank %d (alpha %g) on %s: %.0f of %.0f parameters train (%.2f%%): the model states above are "
                  "theirs; the frozen base%s is held whole on every %srank (%s) with no gradient or optimizer state\n",
                  cfg.model.lora.rank, cfg.model.lora.alpha > 0 ? cfg.model.lora.alpha : cfg.model.lora.rank,
                  cfg.model.lora.target_list().c_str(), trained, all, 100.0 * trained / all,
                  cfg.model.tensor_parallel > 1 ? "'s tensor-parallel part" : "",
                  cfg.model.tensor_parallel > 1 ? "data-parallel " : "", format_bytes(mem.frozen).c_str());
    }
    if (cfg.model.moe.enabled(cfg.model.num_layers)) {
      const auto& m = cfg.model.moe;
      std::string counts;
      for (int l = 0; l < cfg.model.num_layers; ++l)
        if (int e = m.experts_of(l, cfg.model.num_layers)) counts += (counts.empty() ? "" : ", ") + std::to_string(l + 1) + ":" + std::to_string(e);
      std::cout << "> MoE: experts per layer (1-based layer:experts) " << counts << "; top-" << m.topk
                << (m.residual ? ", residual MoE" : "") << ", capacity factor " << m.train_capacity_factor << " (eval "
                << m.eval_capacity_factor << "), " << (m.drop_tokens ? "token dropping" : "no token dropping")
                << "; expert-parallel size " << cfg.moe_ep << " (" << grid.expert_dp().size()
                << " ranks hold each expert; expert gradients reduced over them only)"
                << (trainer.model().drops_duplicate_tokens()
                        ? "; duplicate token dropping: each of the " + std::to_string(grid.tp().size()) +
                              " tensor-parallel ranks sends 1/" + std::to_string(grid.tp().size()) +
                              " of the routed rows, then an all-gather over them"
                        : std::string())
                << (cfg.model.moe.expert_tensor_parallel && grid.tp().size() > 1
                        ? "; experts split over the " + std::to_string(grid.tp().size()) +
                              " tensor-parallel ranks like the dense MLP"
                        : std::string())
                << "\n";
    }
    if (cfg.recompute_activations)
      std::cout << "> activation checkpointing: each layer's forward recomputed in backward"
                << (cfg.communication_aware_checkpointing
                        ? "; communication-aware: the forward's collective results (post-attention residuals, MoE "
                          "routing, exchanged rows and outputs) kept and replayed, so the recompute communicates "
                          "nothing but sequence parallelism's norm gathers (the bytes kept are in the summary)"
                        : std::string())
                << "\n";
    if (cfg.curriculum.enabled) {
      const auto& cl = cfg.curriculum;
      std::cout << "> sequence-length warmup (" << cl.key << "): " << cl.schedule_type << ", "
                << cl.seqlen(trainer.iteration(), cfg.model.max_seq_length) << " tokens per sample at iteration "
                << trainer.iteration() + 1 << ", " << cl.min_difficulty << " -> " << cl.max_difficulty
                << (cl.schedule_type == "fixed_discrete" ? std::string(" in steps")
                                                         : " over " + std::to_string(cl.total_curriculum_step) +
                                                               " steps in multiples of " + std::to_string(cl.difficulty_step))
                << "; evaluation at " << cfg.model.max_seq_length << "\n";
    }
    for (const auto& mc : cfg.metric_curricula) {
      std::cout << "> curriculum by " << mc.metric << " (" << mc.schedule.key << "): " << mc.difficulty_type
                << " difficulty " << mc.schedule.min_difficulty << " -> " << mc.schedule.max_difficulty << ", "
                << mc.schedule.schedule_type << " over " << mc.schedule.total_curriculum_step << " steps, "
                << mc.clustering_type << " clusters from " << mc.index_to_sample_path << "; evaluation on the whole validation split\n";
    }
    if (cfg.random_ltd.enabled) {
      const auto& r = cfg.random_ltd;
      const auto layers = r.layers(cfg.model.num_layers);
      std::cout << "> random-LTD (" << r.key << "): layers " << layers.front() << ".." << layers.back() << " ("
                << layers.size() << " of " << cfg.model.num_layers << ", 0-based) keep "
                << r.kept(trainer.iteration(), cfg.model.max_seq_length) << " tokens per sample at iteration "
                << trainer.iteration() + 1 << ", " << r.min_value << " -> " << r.max_value << " over " << r.require_steps
                << " steps in multiples of " << r.seq_per_step << "; learning rate by "
                << (r.layer_token_lr ? "layer-tokens (" + std::to_string(r.warmup_layer_tokens) + " warmup, " +
                                           std::to_string(r.total_layer_tokens) + " in all)"
                                     : std::string("its own flags (token-based ones count effective tokens)"))
                << "; evaluation on every token\n";
    }
    if (grid.tp().size() > 1)
      std::cout << "> tensor parallel: each layer split over " << grid.tp().size()
                << " ranks (QKV by heads and fc column-parallel, attention output and fc2 row-parallel, vocab-parallel "
                   "embedding and loss; norms, positions"
                << (!cfg.model.moe.enabled(cfg.model.num_layers) ? ""
                    : cfg.model.moe.expert_tensor_parallel    ? " and routers replicated, experts split like fc and fc2"
                                                              : ", routers and experts")
                << (cfg.model.moe.expert_tensor_parallel ? "" : " replicated") << "); ZeRO and "
                << "gradient reduction over the " << grid.dp().size() << " data-parallel ranks of each tensor-parallel index"
                << (cfg.model.sequence_parallel ? "; sequence parallel: norms and residuals on 1/" + std::to_string(grid.tp().size()) +
                                                      " of the tokens, all-gather/reduce-scatter in place of the all-reduces"
                                                : std::string())
                << (trainer.tp_collectives().empty() ? "" : "; collectives: " + trainer.tp_collectives()) << "\n";
    if (data.unigram_ppl > 0) std::printf("> unigram baseline perplexity on the validation split: %.2f\n", data.unigram_ppl);
    std::cout << std::flush;
  }
  engine::TrainSummary s = trainer.train(*data.train, data.valid.get(), &records);
  mem = trainer.memory_report();  // working buffers have their high-water mark now
  nlohmann::json host = {{"parameters", world.allgather(double(mem.params))},
                         {"frozen_parameters", world.allgather(double(mem.frozen))},
                         {"gradients", world.allgather(double(mem.grads + mem.grad_shard))},
                         {"optimizer_states", world.allgather(double(mem.optimizer))},
                         {"working_buffers_peak", world.allgather(double(mem.working_peak))},
                         {"activations", world.allgather(double(mem.activations))}};
  const double steps = std::max<double>(1, double(s.last_iteration - s.start_iteration));  // per-step averages
  nlohmann::json device = nullptr;
  if (mem.states_on_device) {  // GPU-resident: every model state is the device's, nothing crosses per step
    device = {{"mode", "resident"},
              {"parameters_and_gradients", world.allgather(double(mem.params + mem.grads + mem.grad_shard))},
              {"optimizer_states", host["optimizer_states"]},
              {"working_buffers_peak", host["working_buffers_peak"]},
              {"activations", host["activations"]},
              {"parameter_bytes_to_device_per_step", world.allgather(0.0)},
              {"gradient_bytes_to_host_per_step", world.allgather(0.0)}};
    host = {{"frozen_parameters", host["frozen_parameters"]}};
  } else if (cfg.device == "cuda") {
    const auto* ds = trainer.device_store();
    device = {{"mode", "offload"},
              {"parameters_and_gradients", world.allgather(double(mem.device_params_grads))},
              {"activations", host["activations"]},
              // parameters copied in and gradients copied back, averaged over the steps run (an
              // evaluation's copies count too; tokens, targets and losses do not)
              {"parameter_bytes_to_device_per_step", world.allgather(ds->bytes_to_device() / steps)},
              {"gradient_bytes_to_host_per_step", world.allgather(ds->bytes_to_host() / steps)}};
    host.erase("activations");
  }
  const std::vector<double> sent = world.allgather(trainer.comm_bytes_per_step());
  std::vector<double> a2a = world.allgather(trainer.model().alltoall_bytes() / steps);
  const std::vector<double> cac_kept = world.allgather(double(trainer.model().kept_for_replay_bytes()));
  const std::vector<double> moe_tp = world.allgather(trainer.model().moe_tp_bytes() / steps);
  const parallel::SwapTraffic tr = trainer.zero().swap_traffic();
  // Tensor parallelism: the activations' all-reduces (f and g) per step, against Megatron's count
  // for the layers, 4 all-reduces of B*s*h per layer and micro-batch (docs/tensor-parallel.md).
  const std::vector<double> tp_bytes = world.allgather(trainer.tp_bytes_per_step());
  const std::vector<double> tp_wire = world.allgather(trainer.tp_wire_bytes_per_step());
  const double tp_formula = 4.0 * cfg.model.num_layers * cfg.grad_accum * cfg.micro_batch * cfg.model.max_seq_length *
                            cfg.model.hidden_size * sizeof(float);
  nlohmann::json nvme = {{"parameters", world.allgather(double(mem.nvme_params))},
                         {"optimizer_states", world.allgather(double(mem.nvme_optimizer))},
                         {"file_bytes", world.allgather(double(mem.nvme_file))}};
  nlohmann::json aio_engine = nullptr;  // each rank's swap IO engine (`auto` resolves node by node)
  if (trainer.zero().offloaded()) aio_engine = world.allgather_string(io::engine_name(trainer.zero().swap_engine()));
  nlohmann::json offload = {{"aio_engine", aio_engine},
                            {"bytes_read", world.allgather(tr.bytes_read)},
                            {"bytes_written", world.allgather(tr.bytes_written)},
                            {"optimizer_sweep_bytes_per_step", world.allgather(tr.optimizer_bytes / steps)},
                            {"optimizer_sweep_seconds_per_step", world.allgather(tr.optimizer_seconds / steps)},
                            {"optimizer_io_wait_seconds_per_step", world.allgather(tr.optimizer_io_wait / steps)},
                            {"optimizer_sweep_behind_seconds_per_step", world.allgather(tr.optimizer_seconds_behind / steps)},
                            {"param_read_seconds_per_step", world.allgather(tr.param_read_seconds / steps)}};
  if (root) {
    if (trainer.zero().offloaded()) {
      double opt_bytes = 0, opt_secs = 0;
      for (double v : offload["optimizer_sweep_bytes_per_step"]) opt_bytes += v;
      for (double v : offload["optimizer_sweep_seconds_per_step"]) opt_secs = std::max(opt_secs, v);
      std::printf("> NVMe offload: optimizer sweep moves %s per step over all ranks in %.2f s (%.2f GB/s aggregate); "
                  "rank 0 waited %.2f s per step for parameter slices\n",
                  format_bytes(opt_bytes).c_str(), opt_secs, opt_secs > 0 ? opt_bytes / opt_secs / 1e9 : 0.0,
                  tr.param_read_seconds / steps);
    }
    std::printf("> data-parallel traffic: %s sent per step per rank (ring volume of the collectives issued; %.2f x parameters x 4 B)\n",
                format_bytes(sent[0]).c_str(), sent[0] / (4.0 * trainer.model().layout().numel()));
    if (grid.tp().size() > 1)
      std::printf("> tensor-parallel traffic: %s of activations %s per step per rank, %s on a ring (Megatron's "
                  "4 x B*s*h all-reduced per layer: %s; ours adds the embedding's and the LM head's, and the "
                  "forward's again with recomputation)\n",
                  format_bytes(tp_bytes[0]).c_str(),
                  cfg.model.sequence_parallel ? "all-gathered or reduce-scattered" : "all-reduced",
                  format_bytes(tp_wire[0]).c_str(), format_bytes(tp_formula).c_str());
    double final_val = s.val_losses.empty() ? NAN : s.val_losses.back().second;
    if (cfg.skip_train)
      std::printf("> --skip-train: evaluated the checkpoint of iteration %lld in %.1f s, peak resident memory per rank %s\n",
                  s.last_iteration, s.seconds, format_bytes((double)s.peak_rss_bytes).c_str());
    else
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
                              {"checkpoint_saves", [&] {
                                 nlohmann::json a = nlohmann::json::array();
                                 for (const auto& v : s.saves)
                                   a.push_back({{"iteration", v.iteration}, {"async", v.async}, {"stall_seconds", v.stall_seconds},
                                                {"seconds", v.seconds}, {"bytes", v.bytes}});
                                 return a;
                               }()},
                              {"total_seconds", s.seconds},
                              {"tokens_per_second", s.tokens_per_second},
                              {"consumed_tokens", trainer.consumed_tokens()},
                              {"consumed_layer_tokens", trainer.consumed_layer_tokens()},
                              {"final_lm_loss", s.steps.empty() ? NAN : s.steps.back().lm_loss},
                              {"skipped_iterations", s.skipped_iterations},
                              {"world_size", world.size()},
                              {"peak_rss_bytes_per_rank", s.peak_rss_per_rank},
                              {"parameters", trainer.model().layout().full_numel()},
                              {"parameters_per_rank", trainer.model().layout().numel()},
                              {"zero_stage", cfg.zero.stage},
                              {"device", cfg.device},
                              {"attention_kernel", trainer.attention_kernel()},
                              {"half_activations", trainer.model().keeps_half_activations()},
                              {"half_pre_activations", trainer.model().keeps_half_pre_activations()},
                              {"half_logits", trainer.model().keeps_half_logits()},
                              // bytes each rank holds, per tier (index = rank); the CPU backend's
                              // device memory is host memory (device: null). With --device cuda the
                              // activations are device memory, and are reported there.
                              {"memory_per_rank", {{"host", host}, {"device", device}, {"nvme", nvme}}},
                              {"nvme_offload", offload},
                              {"comm_bytes_per_step_per_rank", sent}};
    if (cfg.model.moe.enabled(cfg.model.num_layers)) {
      summary["moe"] = {{"expert_parallel_size", cfg.moe_ep},
                        {"moe_loss", s.steps.empty() ? NAN : s.steps.back().moe_loss},
                        {"layers", s.steps.empty() ? nlohmann::json(nullptr) : s.steps.back().moe_layers},
                        // bytes each rank sent to other ranks in MoE all-to-alls (two per MoE layer in
                        // forward, two in backward; evaluation's too), averaged over the steps run
                        {"alltoall_bytes_per_step_per_rank", a2a},
                        // TED (tensor and expert parallelism): each tensor-parallel rank sends 1/T of
                        // the rows and the tensor-parallel group all-gathers them; tensor-parallel
                        // experts sum their outputs over it: ring bytes per rank of those collectives
                        {"duplicate_token_dropping", trainer.model().drops_duplicate_tokens()},
                        {"tp_bytes_per_step_per_rank", moe_tp},
                        {"alltoall_calls_per_step", double(trainer.model().alltoall_calls()) / steps}};
    }
    if (cfg.recompute_activations)
      summary["activation_checkpointing"] = {{"communication_aware", cfg.communication_aware_checkpointing},
                                             // CAC: the kept collective results, per rank
                                             {"kept_for_replay_bytes_per_rank", cac_kept}};
    if (grid.tp().size() > 1)
      summary["tensor_parallel"] = {{"size", grid.tp().size()},
                                    {"sequence_parallel", cfg.model.sequence_parallel},
                                    // payload bytes of the f/g collectives per training step (the
                                    // all-reduces, or with sequence parallelism the all-gathers and
                                    // reduce-scatters), and what a ring moves per rank for them
                                    {"allreduce_bytes_per_step_per_rank", tp_bytes},
                                    {"wire_bytes_per_step_per_rank", tp_wire},
                                    {"megatron_layer_formula_bytes_per_step", tp_formula}};
    if (!s.val_losses.empty()) {
      summary["final_val_loss"] = final_val;
      summary["final_val_ppl"] = std::exp(final_val);
    }
    if (data.unigram_ppl > 0) summary["unigram_val_ppl"] = data.unigram_ppl;
    if (!s.device_ms.empty())  // rank 0's device time per iteration (CUDA events), by phase
      summary["device_ms_per_iteration"] = {{"forward", s.device_ms[0]}, {"backward", s.device_ms[1]},
                                            {"optimizer", s.device_ms[2]}, {"idle", s.device_ms[3]},
                                            {"step", s.device_ms[4]}};
    records.record(summary);
    if (!records.stopped().empty()) summary["records_stopped"] = records.stopped();  // writers a full disk stopped
    if (!cfg.json_summary.empty()) {
      // Written whole or not at all (temp file + rename), with the segment's provenance.
      summary["provenance"] = records.provenance();
      write_json_file(cfg.json_summary, summary);
    }
  }
  // A stop on SIGUSR1/SIGTERM saved a checkpoint: a documented code tells the job script to requeue.
  return s.exit_reason == "signal" ? engine::kExitSavedOnSignal : 0;
}

int pretrain_main(const char* prog, int argc, char** argv, bool require_moe, bool finetune_app) {
  g_prog = prog;
  if (print_version_if_asked(prog, argc, argv)) return 0;
  comm::Environment env(&argc, &argv);
  try {
    return run(argc, argv, require_moe, finetune_app);
  } catch (const Error& e) {
    // An error every rank threw together (setup checks, a save that failed anywhere) is printed once
    // and ends the job normally; one rank's own error aborts the job so no peer waits forever.
    const bool together = g_setup_phase || e.is_agreed();
    if (!together || comm::Communicator::world().rank() == 0) std::fprintf(stderr, "%s: error: %s\n", g_prog, e.what());
    if (!together) comm::Environment::abort(1);
    return 1;
  } catch (const std::bad_alloc&) {
    // What the start-up memory check does not count (activations, MPI's buffers) ran out.
    std::fprintf(stderr, "%s: error: [rank %d] out of host memory (std::bad_alloc; resident %s); hint: lower "
                 "--micro-batch-size, add --checkpoint-activations, or use more ranks with a higher --zero-stage\n",
                 g_prog, comm::Communicator::world().rank(), format_bytes(double(current_rss_bytes())).c_str());
    comm::Environment::abort(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: [rank %d] %s\n", g_prog, comm::Communicator::world().rank(), e.what());
    comm::Environment::abort(1);
  }
}

}  // namespace hpct::engine
