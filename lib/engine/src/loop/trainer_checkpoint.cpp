// The Trainer's checkpoints: what a checkpoint records (meta, state), synchronous and asynchronous
// saves, and the load. Split from trainer.cpp (the loop) by responsibility. See trainer.hpp.
#include "hpct/engine/loop/trainer.hpp"

#include "trainer_async.hpp"
#include "train_log.hpp"

#include "hpct/engine/checkpoint/checkpoint_state.hpp"
#include "hpct/engine/config/preflight.hpp"

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
#include "hpct/engine/checkpoint/checkpointer.hpp"
#include "hpct/engine/checkpoint/tokenizer_identity.hpp"
#include "hpct/engine/records/moe_stats.hpp"

namespace hpct::engine {

CheckpointMeta Trainer::checkpoint_meta() const {
  CheckpointMeta m;
  m.config = config_to_json(cfg_);
  const auto& mc = cfg_.model;
  m.architecture = architecture_of(mc);
  m.tokenizer = cfg_.mock_data ? "mock (vocab " + std::to_string(mc.vocab_size) + ")"
                                : tokenizer_identity(cfg_.tokenizer_spec());
  m.layout = {{"world_size", grid_.world_size()},
              {"dp", grid_.dp().size()},
              {"tp", grid_.tp().size()},
              {"ep", grid_.ep().size()},
              {"zero_stage", cfg_.zero.stage}};
  m.seed = cfg_.seed;
  if (!lora_base_.empty()) m.config["lora_base"] = lora_base_;  // which base the adapters belong to
  return m;
}

TrainingState Trainer::training_state() const {
  TrainingState st;
  st.iteration = iteration_;
  st.consumed_samples = first_sample(iteration_);
  st.consumed_tokens = consumed_tokens_;
  st.consumed_layer_tokens = cfg_.random_ltd.enabled ? consumed_layer_tokens_ : -1;
  st.adam_step = adam_step_;
  st.adam_step_base = adam_base_;
  st.skipped_iterations = skipped_;
  st.nan_iterations = nan_iters_;
  st.loss_scaler = scaler_.state();
  st.optimizer_saved = !cfg_.no_save_optim;
  return st;
}

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

void Trainer::init_stored_layout() {
  const ParamLayout& schema = model_->layout();
  stored_ = schema.trained();
  stored_at_.assign(schema.blocks().size(), 0);
  for (const auto& b : stored_.blocks()) stored_at_[b.origin < 0 ? &b - stored_.blocks().data() : b.origin] = b.offset;
}

void Trainer::visit_stored(bool load, const std::function<void(const parallel::StatePiece&)>& fn) {
  const auto& blocks = model_->layout().blocks();
  if (stored_.blocks().size() == blocks.size()) return zero_->visit_pieces(load, fn);  // nothing frozen
  zero_->visit_pieces(load, [&](const parallel::StatePiece& p) {  // a piece lies inside one block
    auto it = std::upper_bound(blocks.begin(), blocks.end(), p.begin, [](size_t v, const BlockSpec& b) { return v < b.offset; });
    const auto b = static_cast<size_t>(it - blocks.begin() - 1);
    parallel::StatePiece q = p;
    q.begin = stored_at_[b] + (p.begin - blocks[b].offset);
    fn(q);
  });
}

void Trainer::start_async_save() {
  finish_async_save(/*wait=*/true);  // the next save waits for the previous one
  join_update();                     // the state the last step made
  const bool root = grid_.world_rank() == 0;
  auto a = std::make_unique<AsyncSave>();
  Timer stall;
  // This rank's pieces and where their copies go, in a host buffer kept from one save to the next
  // (only the first save pays for its page faults). States in host memory are copied by the
  // background thread; states in the swap file or on the GPU are copied into the buffer now (the
  // swap store and the GPU's stream are not shared with a second thread, and training would move
  // them under its feet).
  map_staging();
  float* const staging = staging_;
  const bool copy_now = !zero_->pieces_are_live();
  std::vector<parallel::StatePiece> live, copies;
  size_t at = 0;
  visit_stored(false, [&](const parallel::StatePiece& p) {
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
  a->pending = a->ck->begin_save(stored_, training_state(), checkpoint_meta());  // collective
  Checkpointer::PendingSave* ps = a->pending.get();
  AsyncSave* self = a.get();
  // Test-only (docs/checkpoints.md): HPCT_TEST_ASYNC_COPY_DELAY_MS holds the copy back, so that the
  // next optimizer step reaches the fence before the copy is done.
  const char* delay_env = std::getenv("HPCT_TEST_ASYNC_COPY_DELAY_MS");
  const int delay_ms = delay_env ? std::atoi(delay_env) : 0;
  a->thread = std::thread([self, ps, delay_ms, live = std::move(live), copies, t = TensorSet::of(stored_, copies)] {
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
  a->record.bytes = 3.0 * stored_.full_numel() * sizeof(float);
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
  join_update();
  const bool root = grid_.world_rank() == 0;
  TrainingState st = training_state();
  TensorSet t;
  t.layout = &stored_;
  t.visit = [this](bool load, const TensorSet::PieceFn& fn) { visit_stored(load, fn); };
  if (root) std::cout << "saving checkpoint at iteration " << std::setw(7) << iteration_ << " to " << cfg_.save_dir << std::endl;
  Timer timer;
  Checkpointer ck(grid_.world(), cfg_.save_dir, cfg_.keep_last);
  std::string file = ck.save(t, st, checkpoint_meta());
  if (root) {
    double bytes = (st.optimizer_saved ? 3.0 : 1.0) * stored_.full_numel() * sizeof(float), secs = timer.seconds();
    std::printf("  successfully saved checkpoint at iteration %7lld to %s (%s in %.2f s, %.2f GB/s)\n", iteration_,
                file.c_str(), format_bytes(bytes).c_str(), secs, bytes / secs / 1e9);
    std::fflush(stdout);
  }
  return file;
}

void Trainer::load_weights(const std::vector<float>& given) {
  const ParamLayout& layout = model_->layout();
  // This rank's values in its layout: the tensor-parallel slice of every split tensor, every replica.
  std::vector<float> part;
  const std::vector<float>* src = &given;
  auto cut = [&](const TensorSpec& t, size_t at) {  // tensor t, whole at given[at...]: this rank's elements
    t.for_full_runs(0, t.numel, [&](uint64_t f, uint64_t lo, uint64_t n) {
      std::copy_n(given.begin() + static_cast<std::ptrdiff_t>(at + f), n, part.begin() + static_cast<std::ptrdiff_t>(t.offset + lo));
    });
  };
  if (cfg_.model.lora.enabled() && given.size() != layout.full_numel()) {
    // LoRA: the base model's weights, whole (no adapters, tensor-parallel size 1 order). The
    // adapters start as initialisation makes them; this rank's slices of the base go over the rest.
    model::GptConfig base = cfg_.model;
    base.vocab_multiple = static_cast<int>(base.vocab_granule());  // the same padded vocabulary
    base.tensor_parallel = 1;
    base.sequence_parallel = false;
    base.lora = model::LoraConfig{};
    const ParamLayout bl = model::Gpt::layout_for(base);
    if (given.size() == bl.numel()) {
      char hex[17];
      std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fnv1a64(given.data(), given.size() * sizeof(float)));
      lora_base_ = std::string("fnv1a64:") + hex;
      part.assign(layout.numel(), 0.0f);
      model_->init_params(part.data(), cfg_.seed);
      for (const auto& t : layout.tensors())
        if (t.name.find(".lora_") == std::string::npos) cut(t, bl.find(t.name).offset);
      src = &part;
    }
  }
  if (src == &given) {
    if (given.size() != layout.full_numel())
      throw Error("Trainer::load_weights: " + std::to_string(given.size()) + " values for " + std::to_string(layout.full_numel()) + " parameters");
    if (layout.numel() != layout.full_numel() || grid_.tp().size() > 1) {
      part.assign(layout.numel(), 0.0f);
      size_t at = 0;
      for (const auto& t : layout.tensors()) {
        cut(t, at);
        at += t.full_numel();
      }
      src = &part;
    }
  }
  if (device_store_) device_store_->settle();
  zero_->init_params([&](int block, float* dst) {
    const auto& b = layout.blocks()[block];
    std::copy(src->begin() + static_cast<std::ptrdiff_t>(b.offset), src->begin() + static_cast<std::ptrdiff_t>(b.offset + b.numel), dst);
  });
  if (device_store_) device_store_->invalidate();
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
  const TrainingState st = read_checkpoint(file, checkpoint_meta(), cfg_.no_load_optim);
  iteration_ = st.iteration;
  adam_step_ = st.adam_step;
  // Fresh moments start their bias correction at step 1 (the schedule keeps the run's steps).
  adam_base_ = cfg_.no_load_optim ? -st.adam_step : st.adam_step_base;
  skipped_ = st.skipped_iterations;
  nan_iters_ = st.nan_iterations;
  sample_base_ = st.consumed_samples - batches_.consumed_before(st.iteration);
  // A ramp is a function of the consumed samples: resuming it needs the run's own batches so far.
  if (batches_.ramps() && sample_base_ != 0)
    throw config_error("--rampup-batch-size", "the checkpoint consumed " + std::to_string(st.consumed_samples) + " samples in " +
                                                  std::to_string(st.iteration) + " iterations, but this run's batch ramp gives " +
                                                  std::to_string(batches_.consumed_before(st.iteration)),
                       "resume with the --rampup-batch-size and --global-batch-size the run was saved with");
  // Before sequence-length warmup every sample was --seq-length tokens (the stored config's).
  consumed_tokens_ = st.consumed_tokens >= 0 ? st.consumed_tokens : st.consumed_samples * (long long)cfg_.model.max_seq_length;
  // Without random-LTD every layer saw every token.
  consumed_layer_tokens_ =
      st.consumed_layer_tokens >= 0 ? st.consumed_layer_tokens : consumed_tokens_ * (long long)cfg_.model.num_layers;
  if (!cfg_.no_load_optim) scaler_.restore(st.loss_scaler);
  if (root && cfg_.no_load_optim)
    std::cout << "> --no-load-optim: Adam's moments, bias correction and the loss scale start afresh; weights, iteration, "
                 "data position and learning-rate schedule continue"
              << std::endl;
  if (root) {
    double bytes = 3.0 * stored_.full_numel() * sizeof(float), secs = timer.seconds();
    std::printf("  successfully loaded checkpoint from %s at iteration %lld (%s in %.2f s, %.2f GB/s)\n", file.c_str(),
                iteration_, format_bytes(bytes).c_str(), secs, bytes / secs / 1e9);
    std::fflush(stdout);
  }
  return file;
}

TrainingState Trainer::read_checkpoint(const std::string& file, const CheckpointMeta& meta, bool fresh_moments) {
  TrainingState st;
  TensorSet t;
  t.layout = &stored_;
  t.visit = [this, fresh_moments](bool load, const TensorSet::PieceFn& fn) {
    if (!fresh_moments) return visit_stored(load, fn);
    visit_stored(load, [&](const parallel::StatePiece& p) {  // the file's values in, then the moments zeroed
      fn(p);
      std::memset(p.exp_avg, 0, p.count * sizeof(float));
      std::memset(p.exp_avg_sq, 0, p.count * sizeof(float));
    });
  };
  if (device_store_) device_store_->settle();  // no upload still reads the copies the load rewrites
  Checkpointer(grid_.world(), cfg_.save_dir, cfg_.keep_last).load(file, t, st, meta, /*need_moments=*/!fresh_moments);
  zero_->after_load();  // re-replicate what every rank holds whole
  if (device_store_) device_store_->invalidate();
  return st;
}

void Trainer::load_for_finetune(const std::string& file) {
  CheckpointMeta meta = checkpoint_meta();
  meta.config["finetune_resume_optimizer"] = true;  // a new schedule and seed are this run's to choose
  const TrainingState st = read_checkpoint(file, meta);
  adam_base_ = st.adam_step_base + st.adam_step;
  scaler_.restore(st.loss_scaler);
}

Trainer::~Trainer() {
  async_.reset();      // joins a background writer still running (an error path)
  if (staging_) ::munmap(staging_, staging_bytes_);
}

}  // namespace hpct::engine
