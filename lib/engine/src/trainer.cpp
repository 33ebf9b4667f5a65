// The training loop. See trainer.hpp.
#include "hpct/engine/trainer.hpp"

#include "hpct/engine/preflight.hpp"

#include <sys/mman.h>
#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <csignal>
#include <cmath>
#include <iomanip>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "hpct/core/error.hpp"
#include "hpct/core/rng.hpp"
#include "hpct/core/sysinfo.hpp"
#include "hpct/core/timer.hpp"
#include "hpct/core/units.hpp"
#include "hpct/engine/checkpointer.hpp"
#include "hpct/engine/moe_stats.hpp"

namespace hpct::engine {

Trainer::Trainer(const TrainConfig& cfg, const comm::ProcessGrid& grid) : cfg_(cfg), grid_(grid) {
  if (cfg_.device == "cuda") {
    // One GPU per rank, picked by the node-local rank (modulo the GPUs seen). Taking it can fail on
    // one rank only (a busy exclusive-mode GPU, no memory), so every rank learns of it and stops.
    const auto& world = comm::Communicator::world();
    const int local = world.node_local_rank();
    comm::throw_if_any(world, comm::error_text_of([&] { ops_ = kernels::cuda_ops(local); }));
  }
  const int ep = grid_.ep().size();
  model_ = std::make_unique<model::Gpt>(cfg_.model, compute_precision(), cfg_.recompute_activations, ops_.get(),
                                        ep > 1 ? &grid_.ep() : nullptr);
  // Dense blocks are reduced over the dense data-parallel group; this rank's experts over the ranks
  // that hold the same experts. A dense model has one group: one engine over the whole layout.
  const ParamLayout& schema = model_->layout();
  std::vector<parallel::StoreGroup> groups;
  groups.push_back({ReduceGroup::dense, schema.blocks_of(ReduceGroup::dense), &grid_.dp(), ""});
  std::vector<int> experts;
  for (int b : model_->held_blocks())
    if (schema.blocks()[b].group == ReduceGroup::expert) experts.push_back(b);
  if (!experts.empty())
    groups.push_back({ReduceGroup::expert, experts, &grid_.expert_dp(),
                      "zero.expert.ep" + std::to_string(grid_.ep().rank()) + ".dp" + std::to_string(grid_.expert_dp().rank())});
  zero_ = std::make_unique<parallel::GroupedStore>(schema, std::move(groups), cfg_.zero, compute_precision(), &grid_.ep());
  if (ops_ || cfg_.via_device_store)
    device_store_ = std::make_unique<parallel::DeviceStore>(
        *zero_, model_->layout(), model_->ops(), /*cache_params=*/cfg_.zero.stage <= 2,
        zero_->half() ? compute_precision() : kernels::Precision::fp32);  // 16-bit runs: 2-byte device copies
  // Every rank initialises from the same seed, block by block, keeping what it holds: replicas
  // (and shards) are consistent without a broadcast.
  zero_->init_params([&](int block, float* dst) { model_->init_block(block, dst, cfg_.seed); });
  if (cfg_.async_save && !cfg_.save_dir.empty()) map_staging();
  scaler_ = LossScaler(cfg_.loss_scale, cfg_.precision == PrecisionMode::fp16);
  const int T = cfg_.model.max_seq_length;
  sample_buf_.resize(T + 1);
  tokens_.resize((size_t)cfg_.micro_batch * T);
  targets_.resize((size_t)cfg_.micro_batch * T);
}


kernels::Precision Trainer::compute_precision() const {
  switch (cfg_.precision) {
    case PrecisionMode::bf16: return kernels::Precision::bf16;
    case PrecisionMode::fp16: return kernels::Precision::fp16;
    default: return kernels::Precision::fp32;
  }
}

Trainer::MemoryReport Trainer::memory_report() const {
  MemoryReport r;
  auto z = zero_->memory();
  r.params = z.params;
  r.grads = z.grads;
  r.optimizer = z.optimizer;
  r.grad_shard = z.grad_shard;
  r.working_peak = z.working_peak;
  r.nvme_params = z.nvme_params;
  r.nvme_optimizer = z.nvme_optimizer;
  r.nvme_file = z.nvme_file;
  r.activations = model_->activation_bytes();
  if (ops_) r.device_params_grads = device_store_->device_bytes();
  return r;
}

void Trainer::load_micro_batch(const io::TokenDataset& data, long long first_sample) {
  const int T = cfg_.model.max_seq_length, V = cfg_.model.vocab_size;
  for (int j = 0; j < cfg_.micro_batch; ++j) {
    const size_t sample = (size_t)(first_sample + j) % data.size();
    data.get(sample, sample_buf_.data());  // (T+1) tokens
    // The dataset reader bounds structure only: an id from another tokenizer (or a corrupt .bin)
    // would index past the embedding table.
    for (int t = 0; t <= T; ++t)
      if (sample_buf_[t] < 0 || sample_buf_[t] >= V) {
        std::string files;
        for (const auto& p : cfg_.data_path) files += (files.empty() ? "" : ", ") + p + ".bin";
        throw file_error(files.empty() ? "--mock-data" : files,
                         "sample " + std::to_string(sample) + " holds token id " + std::to_string(sample_buf_[t]) +
                             " at position " + std::to_string(t) + ", outside the vocabulary [0, " + std::to_string(V) + ")",
                         "the dataset was written with another tokenizer or is corrupt: run preprocess_data again with "
                         "this run's --vocab-file and --merge-file");
      }
    std::memcpy(&tokens_[(size_t)j * T], sample_buf_.data(), T * sizeof(int32_t));
    std::memcpy(&targets_[(size_t)j * T], sample_buf_.data() + 1, T * sizeof(int32_t));
  }
}

double Trainer::step(const io::TokenDataset& data, long long iteration, StepRecord& rec) {
  const int T = cfg_.model.max_seq_length, mb = cfg_.micro_batch, dp = grid_.dp().size(), r = grid_.dp().rank();
  const long long GB = cfg_.global_batch;
  const double scale = scaler_.scale();
  const float dloss = static_cast<float>(scale / (double(GB) * T));  // mean over the global batch
  const double sent0 = zero_->bytes_sent();
  zero_->begin_step();
  double loss_sum = 0;
  for (int m = 0; m < cfg_.grad_accum; ++m) {
    // Sample order is a function of (iteration, micro-step, dp rank) only: N ranks with k micro-steps
    // see exactly the samples one rank sees with N*k micro-steps.
    const long long first = sample_base_ + iteration * GB + ((long long)m * dp + r) * mb;
    load_micro_batch(data, first);
    zero_->begin_micro_step(m == cfg_.grad_accum - 1);
    model_->set_routing_seed(mix_seed(cfg_.seed, static_cast<uint64_t>(first), 0x726f757465));
    loss_sum += model_->forward_backward(store(), tokens_.data(), targets_.data(), mb, T, dloss);
    zero_->end_micro_step();
  }
  grid_.dp().allreduce_sum(&loss_sum, 1);
  rec.lm_loss = loss_sum / (double(GB) * T);
  if (cfg_.model.moe.enabled(cfg_.model.num_layers)) {
    MoeStepStats ms = gather_moe_stats(*model_, grid_.dp());
    rec.moe_loss = ms.moe_loss;
    rec.moe_layers = std::move(ms.layers);
  }
  rec.loss_scale = scale;

  double sumsq = zero_->grad_sumsq();
  bool overflow = !std::isfinite(sumsq);
  // The sum of squares is the same on every rank (all-reduced), so every rank decides alike.
  bool ok = scaler_.update(overflow);
  rec.grad_norm = overflow ? NAN : std::sqrt(sumsq) / scale;
  if (!ok) {
    rec.skipped = true;
    rec.learning_rate = learning_rate(cfg_, adam_step_);
    comm_bytes_ += zero_->bytes_sent() - sent0;
    ++comm_steps_;
    return rec.lm_loss;
  }
  double clip = 1.0;
  if (cfg_.clip_grad > 0 && rec.grad_norm > cfg_.clip_grad) clip = cfg_.clip_grad / (rec.grad_norm + 1e-6);
  const double lr = learning_rate(cfg_, adam_step_);
  rec.learning_rate = lr;
  ++adam_step_;
  parallel::AdamParams ap;
  ap.lr = (float)lr;
  ap.beta1 = (float)cfg_.beta1;
  ap.beta2 = (float)cfg_.beta2;
  ap.eps = (float)cfg_.eps;
  ap.weight_decay = (float)cfg_.weight_decay;
  ap.step = (int)adam_step_;
  ap.grad_scale = static_cast<float>(clip / scale);
  snapshot_fence();  // a background save may still be copying the state this step changes
  zero_->adam_step(ap);
  if (device_store_) device_store_->invalidate();
  comm_bytes_ += zero_->bytes_sent() - sent0;
  ++comm_steps_;
  return rec.lm_loss;
}

double Trainer::evaluate(const io::TokenDataset& data) {
  const int T = cfg_.model.max_seq_length, mb = cfg_.micro_batch, dp = grid_.dp().size(), r = grid_.dp().rank();
  const long long GB = cfg_.global_batch;
  model::ParamStore& store = this->store();  // forward only: parameters gathered as in training
  double sums[2] = {0, 0};  // loss sum, token count
  for (int e = 0; e < cfg_.eval_iters; ++e) {
    for (int m = 0; m < cfg_.grad_accum; ++m) {
      const long long first = e * GB + ((long long)m * dp + r) * mb;
      load_micro_batch(data, first);
      model_->set_routing_seed(mix_seed(cfg_.seed, static_cast<uint64_t>(first), 0x6576616c));
      sums[0] += model_->forward_loss(store, tokens_.data(), targets_.data(), mb, T);
      sums[1] += (double)mb * T;
    }
  }
  grid_.dp().allreduce_sum(sums, 2);
  return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}

std::string format_log_line(long long iteration, long long train_iters, long long consumed_samples,
                            long long consumed_tokens, double ms_per_iter, double lr, int global_batch, double loss,
                            double loss_scale, double grad_norm, long long skipped, long long nan_iters,
                            double tokens_per_sec, double tokens_per_sec_per_rank, double tflops_per_rank,
                            double moe_loss) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                " iteration %8lld/%8lld | consumed samples: %12lld | consumed tokens: %12lld | elapsed time per "
                "iteration (ms): %.1f | learning rate: %.3E | global batch size: %5d | lm loss: %.6E | loss scale: "
                "%.1f | grad norm: %.3f | number of skipped iterations: %3lld | number of nan iterations: %3lld | "
                "tokens per second: %.1f | tokens per gpu per second (tgs): %.1f | TFLOPs: %.2f |",
                iteration, train_iters, consumed_samples, consumed_tokens, ms_per_iter, lr, global_batch, loss,
                loss_scale, grad_norm, skipped, nan_iters, tokens_per_sec, tokens_per_sec_per_rank, tflops_per_rank);
  std::string line = buf;
  if (std::isfinite(moe_loss)) {  // Megatron-DeepSpeed puts it right after the lm loss
    char m[64];
    std::snprintf(m, sizeof m, " moe loss: %.6E |", moe_loss);
    const size_t at = line.find(" loss scale:");
    line.insert(at == std::string::npos ? line.size() : at, m);
  }
  return line;
}

namespace {
volatile std::sig_atomic_t g_stop_flag = 0;
extern "C" void hpct_on_stop_signal(int) { g_stop_flag = 1; }

// FNV-1a 64 of a file's bytes, for the tokenizer's identity in checkpoints.
std::string file_fingerprint(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return "unreadable";
  uint64_t h = kFnv1aBasis;
  char buf[65536];
  while (f.read(buf, sizeof buf) || f.gcount() > 0) h = fnv1a64(buf, static_cast<size_t>(f.gcount()), h);
  char out[32];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}
}  // namespace

int install_save_on_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = hpct_on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return kExitSavedOnSignal;
}

CheckpointMeta Trainer::checkpoint_meta() const {
  CheckpointMeta m;
  m.config = config_to_json(cfg_);
  const auto& mc = cfg_.model;
  m.architecture = {{"model", "gpt"},
                    {"num_layers", mc.num_layers},
                    {"hidden_size", mc.hidden_size},
                    {"num_attention_heads", mc.num_heads},
                    {"seq_length", mc.max_seq_length},
                    {"padded_vocab_size", mc.padded_vocab()}};
  if (mc.moe.enabled(mc.num_layers)) {
    m.architecture["num_experts"] = mc.moe.num_experts;
    m.architecture["expert_interval"] = mc.moe.expert_interval;
    m.architecture["topk"] = mc.moe.topk;
    m.architecture["mlp_type"] = mc.moe.residual ? "residual" : "standard";
  }
  m.tokenizer = cfg_.mock_data ? "mock (vocab " + std::to_string(mc.vocab_size) + ")"
                                : "gpt2-bpe vocab:fnv1a64:" + file_fingerprint(cfg_.vocab_file) +
                                      " merges:fnv1a64:" + file_fingerprint(cfg_.merge_file);
  m.layout = {{"world_size", grid_.world_size()},
              {"dp", grid_.dp().size()},
              {"tp", grid_.tp().size()},
              {"ep", grid_.ep().size()},
              {"zero_stage", cfg_.zero.stage}};
  m.seed = cfg_.seed;
  return m;
}

TrainingState Trainer::training_state() const {
  TrainingState st;
  st.iteration = iteration_;
  st.consumed_samples = sample_base_ + iteration_ * cfg_.global_batch;
  st.adam_step = adam_step_;
  st.skipped_iterations = skipped_;
  st.nan_iterations = nan_iters_;
  st.loss_scaler = scaler_.state();
  return st;
}

// An asynchronous save in flight: the file begun, the thread copying and writing this rank's state.
struct Trainer::AsyncSave {
  std::unique_ptr<Checkpointer> ck;
  std::unique_ptr<Checkpointer::PendingSave> pending;
  std::thread thread;
  Timer since_start;
  TrainSummary::Save record;
  double stall = 0;  // this rank's: the collective start, plus any wait at the snapshot fence
  std::mutex mu;
  std::condition_variable cv;
  bool copied = false;
  ~AsyncSave() {
    if (thread.joinable()) thread.join();
  }
};

void Trainer::map_staging() {
  const size_t bytes = 3 * zero_->local_numel() * sizeof(float);
  if (staging_ || bytes == 0) return;
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (mem == MAP_FAILED)
    throw Error("--async-save: cannot map " + format_bytes(double(bytes)) + " of host memory for the state's copy: " +
                    std::strerror(errno),
                Error::Context{"", "--async-save", "save synchronously (drop --async-save) or free memory"});
  staging_ = static_cast<float*>(mem);
  staging_bytes_ = bytes;
}

// The three arrays of one piece, from where the state lives into the save's host copy.
static void copy_piece(const parallel::StatePiece& from, const parallel::StatePiece& to) {
  std::memcpy(to.params, from.params, from.count * sizeof(float));
  std::memcpy(to.exp_avg, from.exp_avg, from.count * sizeof(float));
  std::memcpy(to.exp_avg_sq, from.exp_avg_sq, from.count * sizeof(float));
}

void Trainer::start_async_save() {
  finish_async_save(/*wait=*/true);  // the next save waits for the previous one
  const bool root = grid_.world_rank() == 0;
  auto a = std::make_unique<AsyncSave>();
  Timer stall;
  // This rank's pieces and where their copies go, in a host buffer kept from one save to the next
  // (only the first save pays for its page faults). States in memory are copied by the background
  // thread; states in the swap file are read into the buffer now (the swap store is not shared with
  // a second thread, and training would move them under its feet).
  map_staging();
  float* const staging = staging_;
  const bool copy_now = zero_->offloaded();
  std::vector<parallel::StatePiece> live, copies;
  size_t at = 0;
  zero_->visit_pieces(false, [&](const parallel::StatePiece& p) {
    parallel::StatePiece q = p;
    q.params = staging + at;
    q.exp_avg = staging + at + p.count;
    q.exp_avg_sq = staging + at + 2 * p.count;
    at += 3 * p.count;
    if (copy_now) copy_piece(p, q);
    else live.push_back(p);
    copies.push_back(q);
  });
  a->copied = copy_now;
  a->ck = std::make_unique<Checkpointer>(grid_.world(), cfg_.save_dir, cfg_.keep_last);
  a->pending = a->ck->begin_save(model_->layout(), training_state(), checkpoint_meta());  // collective
  Checkpointer::PendingSave* ps = a->pending.get();
  AsyncSave* self = a.get();
  // Test-only (docs/checkpoints.md): HPCT_TEST_ASYNC_COPY_DELAY_MS holds the copy back, so that the
  // next optimizer step reaches the fence before the copy is done.
  const char* delay_env = std::getenv("HPCT_TEST_ASYNC_COPY_DELAY_MS");
  const int delay_ms = delay_env ? std::atoi(delay_env) : 0;
  a->thread = std::thread([self, ps, delay_ms, live = std::move(live), copies, t = TensorSet::of(model_->layout(), copies)] {
    if (!live.empty()) {
      if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      for (size_t i = 0; i < live.size(); ++i) copy_piece(live[i], copies[i]);
      std::lock_guard<std::mutex> lk(self->mu);
      self->copied = true;
      self->cv.notify_all();
    }
    Checkpointer::write_pieces(*ps, t);
  });
  a->record.iteration = iteration_;
  a->record.async = true;
  a->record.bytes = 3.0 * model_->layout().numel() * sizeof(float);
  a->stall = stall.seconds();
  const double started = grid_.world().allreduce_max(a->stall);
  if (root) {
    std::printf("saving checkpoint at iteration %7lld to %s in the background (started in %.3f s; %s)\n", iteration_,
                cfg_.save_dir.c_str(), started,
                copy_now ? "the offloaded state copied to host memory" : "the state is copied before the next optimizer step");
    std::fflush(stdout);
  }
  async_ = std::move(a);
}

void Trainer::snapshot_fence() {
  if (!async_) return;
  Timer wait;
  std::unique_lock<std::mutex> lk(async_->mu);
  async_->cv.wait(lk, [&] { return async_->copied; });
  async_->stall += wait.seconds();
}

bool Trainer::finish_async_save(bool wait, TrainSummary::Save* done, std::string* file) {
  if (!async_) return false;
  // Decided together: every rank's background write must have returned before the collective end.
  const bool mine = Checkpointer::written(*async_->pending);
  if (!wait && grid_.world().allreduce_min(mine ? 1.0 : 0.0) < 0.5) return false;
  async_->thread.join();
  std::string f = async_->ck->finish_save(*async_->pending);
  async_->record.seconds = async_->since_start.seconds();
  async_->record.stall_seconds = grid_.world().allreduce_max(async_->stall);
  if (grid_.world_rank() == 0) {
    const auto& r = async_->record;
    std::printf("  successfully saved checkpoint at iteration %7lld to %s (%s in %.2f s in the background; training "
                "stalled %.3f s)\n",
                r.iteration, f.c_str(), format_bytes(r.bytes).c_str(), r.seconds, r.stall_seconds);
    std::fflush(stdout);
  }
  if (done) *done = async_->record;
  if (file) *file = f;
  async_.reset();
  return true;
}

std::string Trainer::save_checkpoint() {
  finish_async_save(/*wait=*/true);
  const bool root = grid_.world_rank() == 0;
  TrainingState st = training_state();
  TensorSet t;
  t.layout = &model_->layout();
  t.visit = [this](bool load, const TensorSet::PieceFn& fn) { zero_->visit_pieces(load, fn); };
  if (root) std::cout << "saving checkpoint at iteration " << std::setw(7) << iteration_ << " to " << cfg_.save_dir << std::endl;
  Timer timer;
  Checkpointer ck(grid_.world(), cfg_.save_dir, cfg_.keep_last);
  std::string file = ck.save(t, st, checkpoint_meta());
  if (root) {
    double bytes = 3.0 * model_->layout().numel() * sizeof(float), secs = timer.seconds();
    std::printf("  successfully saved checkpoint at iteration %7lld to %s (%s in %.2f s, %.2f GB/s)\n", iteration_,
                file.c_str(), format_bytes(bytes).c_str(), secs, bytes / secs / 1e9);
    std::fflush(stdout);
  }
  return file;
}

std::string Trainer::load_checkpoint() {
  const bool root = grid_.world_rank() == 0;
  // Rank 0 resolves `latest` and tells everyone, so all ranks load the same file.
  std::string file, err;
  if (root) {
    try {
      if (!cfg_.load_path.empty()) {
        file = Checkpointer::resolve(cfg_.load_path);
        struct stat st {};
        if (file.empty() && ::stat(cfg_.load_path.c_str(), &st) != 0 && cfg_.load_path != cfg_.save_dir)
          throw config_error("--load", "'" + cfg_.load_path + "' does not exist", "give a checkpoint directory or file");
      }
      check_run_outputs(cfg_, file);  // before any work: --save, --json, --metrics-file
    } catch (const Error& e) {
      err = e.what();
    }
  }
  grid_.world().bcast_string(err, 0);
  if (!err.empty()) throw Error::agreed(err);  // the line already says "[rank 0]"
  grid_.world().bcast_string(file, 0);
  if (file.empty()) {
    if (cfg_.load_path.empty()) return "";
    if (root) std::cout << "> no checkpoint in " << cfg_.load_path << " yet: starting from iteration 0" << std::endl;
    return "";
  }
  if (root) std::cout << "loading checkpoint from " << file << std::endl;
  Timer timer;
  TrainingState st;
  TensorSet t;
  t.layout = &model_->layout();
  t.visit = [this](bool load, const TensorSet::PieceFn& fn) { zero_->visit_pieces(load, fn); };
  Checkpointer ck(grid_.world(), cfg_.save_dir, cfg_.keep_last);
  ck.load(file, t, st, checkpoint_meta());
  zero_->after_load();  // re-replicate what every rank holds whole
  if (device_store_) device_store_->invalidate();
  iteration_ = st.iteration;
  adam_step_ = st.adam_step;
  skipped_ = st.skipped_iterations;
  nan_iters_ = st.nan_iterations;
  sample_base_ = st.consumed_samples - st.iteration * cfg_.global_batch;
  scaler_.restore(st.loss_scaler);
  if (root) {
    double bytes = 3.0 * model_->layout().numel() * sizeof(float), secs = timer.seconds();
    std::printf("  successfully loaded checkpoint from %s at iteration %lld (%s in %.2f s, %.2f GB/s)\n", file.c_str(),
                iteration_, format_bytes(bytes).c_str(), secs, bytes / secs / 1e9);
    std::fflush(stdout);
  }
  return file;
}

TrainSummary Trainer::train(const io::TokenDataset& train, const io::TokenDataset* valid) {
  const bool root = grid_.world_rank() == 0;
  const int T = cfg_.model.max_seq_length;
  const int world = grid_.world_size();
  std::ofstream metrics;
  if (root && !cfg_.metrics_file.empty()) {
    metrics.open(cfg_.metrics_file);
    if (!metrics) throw file_error(cfg_.metrics_file, "cannot write the metrics file");
  }
  TrainSummary sum;
  Timer total, interval;
  double loss_acc = 0;
  int n_acc = 0, n_steps_in_interval = 0;
  long long& skipped = skipped_;
  long long& nan_iters = nan_iters_;
  const double flops_per_iter = model_->flops_per_iteration(cfg_.global_batch, T);
  const bool saving = !cfg_.save_dir.empty();
  if (saving) install_save_on_signal_handlers();
  sum.start_iteration = iteration_;
  long long it = iteration_;
  for (; it < cfg_.train_iters; ++it) {
    StepRecord rec;
    step(train, it, rec);
    rec.iteration = it + 1;
    iteration_ = it + 1;
    if (rec.skipped) ++skipped;
    if (!std::isfinite(rec.lm_loss)) ++nan_iters;
    else {
      loss_acc += rec.lm_loss;
      ++n_acc;
    }
    ++n_steps_in_interval;
    sum.steps.push_back(rec);
    if ((it + 1) % cfg_.log_interval == 0 || it + 1 == cfg_.train_iters) {
      double secs = interval.seconds() / n_steps_in_interval;
      double tps = double(cfg_.global_batch) * T / secs;
      double tflops = flops_per_iter / secs / world / 1e12;
      double loss = n_acc ? loss_acc / n_acc : NAN;
      if (root) {
        // Samples drawn so far: the checkpoint's count plus this run's (the global batch may have
        // changed at the resume, so not iteration x batch).
        const long long consumed = sample_base_ + (it + 1) * cfg_.global_batch;
        std::cout << format_log_line(it + 1, cfg_.train_iters, consumed, consumed * (long long)T, secs * 1e3, rec.learning_rate,
                                     cfg_.global_batch, loss, rec.loss_scale, rec.grad_norm, skipped, nan_iters, tps,
                                     tps / world, tflops, rec.moe_loss)
                  << std::endl;
        if (metrics) {
          nlohmann::json j = {{"type", "train"},
                              {"iteration", it + 1},
                              {"consumed_samples", consumed},
                              {"consumed_tokens", consumed * (long long)T},
                              {"elapsed_ms_per_iteration", secs * 1e3},
                              {"learning_rate", rec.learning_rate},
                              {"global_batch_size", cfg_.global_batch},
                              {"lm_loss", loss},
                              {"loss_scale", rec.loss_scale},
                              {"grad_norm", std::isfinite(rec.grad_norm) ? nlohmann::json(rec.grad_norm) : nlohmann::json(nullptr)},
                              {"skipped_iterations", skipped},
                              {"nan_iterations", nan_iters},
                              {"tokens_per_second", tps},
                              {"tokens_per_second_per_rank", tps / world},
                              {"tflops_per_rank", tflops}};
          if (std::isfinite(rec.moe_loss)) {
            j["moe_loss"] = rec.moe_loss;
            j["moe_layers"] = rec.moe_layers;
            j["alltoall_bytes_per_rank"] = model_->alltoall_bytes();
          }
          metrics << j.dump() << "\n" << std::flush;
        }
      }
      loss_acc = 0;
      n_acc = 0;
      n_steps_in_interval = 0;
      interval.reset();
    }
    if (valid && cfg_.eval_iters > 0 && ((it + 1) % cfg_.eval_interval == 0 || it + 1 == cfg_.train_iters)) {
      double vl = evaluate(*valid);
      sum.val_losses.emplace_back(it + 1, vl);
      if (root) {
        char buf[256];
        std::snprintf(buf, sizeof buf, " validation loss at iteration %lld | lm loss value: %.6E | lm loss PPL: %.6E |",
                      it + 1, vl, std::exp(vl));
        std::string line(std::strlen(buf), '-');
        std::cout << line << "\n" << buf << "\n" << line << std::endl;
        if (metrics)
          metrics << nlohmann::json({{"type", "eval"}, {"iteration", it + 1}, {"val_loss", vl}, {"val_ppl", std::exp(vl)}}).dump()
                  << "\n" << std::flush;
      }
      interval.reset();  // evaluation time is not training throughput
    }
    // Save and stop decisions are taken together by all ranks (a signal may reach only some).
    bool signalled = saving && grid_.world().allreduce_max(g_stop_flag ? 1.0 : 0.0) > 0;
    bool exit_now = signalled || (cfg_.exit_interval > 0 && (it + 1) % cfg_.exit_interval == 0);
    bool last = it + 1 == cfg_.train_iters;
    if (async_) {  // a background save finished? (one tiny all-reduce per iteration while one runs)
      TrainSummary::Save rec;
      std::string file;
      if (finish_async_save(/*wait=*/exit_now || last, &rec, &file)) {
        sum.saved.push_back(file);
        sum.saves.push_back(rec);
      }
    }
    const bool interval_save = cfg_.save_interval > 0 && (it + 1) % cfg_.save_interval == 0;
    if (saving && (interval_save || exit_now || last)) {
      if (cfg_.async_save && !exit_now && !last) {
        start_async_save();  // the final and the stop-on-signal saves stay synchronous: they must be done at exit
        interval.reset();
      } else {
        Timer t;
        sum.saved.push_back(save_checkpoint());
        TrainSummary::Save rec;
        rec.iteration = it + 1;
        rec.stall_seconds = rec.seconds = t.seconds();
        rec.bytes = 3.0 * model_->layout().numel() * sizeof(float);
        sum.saves.push_back(rec);
        interval.reset();  // saving is not training throughput either
      }
    }
    if (exit_now) {
      sum.exit_reason = signalled ? "signal" : "exit_interval";
      if (root)
        std::cout << (signalled ? "> stop requested by a signal: " : "> exit interval reached: ")
                  << "exiting after iteration " << it + 1 << std::endl;
      ++it;
      break;
    }
  }
  if (async_) {  // the loop ended without a final save (e.g. train_iters reached at an interval save)
    TrainSummary::Save rec;
    std::string file;
    if (finish_async_save(/*wait=*/true, &rec, &file)) {
      sum.saved.push_back(file);
      sum.saves.push_back(rec);
    }
  }
  sum.last_iteration = it;
  sum.seconds = total.seconds();
  sum.skipped_iterations = skipped;
  sum.tokens_per_second = double(it - sum.start_iteration) * cfg_.global_batch * T / sum.seconds;
  // Peak resident memory of every rank (measured, VmHWM), gathered everywhere for the summary.
  sum.peak_rss_per_rank = grid_.world().allgather((double)peak_rss_bytes());
  for (double v : sum.peak_rss_per_rank) sum.peak_rss_bytes = std::max<uint64_t>(sum.peak_rss_bytes, (uint64_t)v);
  return sum;
}

}  // namespace hpct::engine

namespace hpct::engine {
Trainer::~Trainer() {  // here, where AsyncSave is complete
  async_.reset();      // joins a background writer still running (an error path)
  if (staging_) ::munmap(staging_, staging_bytes_);
}
}  // namespace hpct::engine
