// A test backend: the CPU ops behind host_memory() == false, so the model takes its device paths
// (tokens and targets copied in, losses copied out, tensor-parallel collectives staged through host
// buffers) on this machine. The memory is host memory all the same, so a host read of a device
// pointer would go unnoticed here; what this checks is the staging's arithmetic (which rows go out,
// which come back), bitwise against the CPU backend's run of the same ops. Counts the bytes copied
// out to the host. With defer_transfers(true) its asynchronous transfers are not done until waited
// for: each copy reads its source and writes its destination only when wait_transfer or
// await_transfer reaches it (per direction, in queue order), so a caller that reads a destination,
// or changes or frees a source, before its ticket says so gets stale or wrong data.
#pragma once
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "hpct/kernels/ops_backend.hpp"

namespace hpct::test {

class StagedCpuOps final : public kernels::OpsBackend {
 public:
  StagedCpuOps() : in_(kernels::cpu_ops()) {}
  std::string name() const override { return "staged-cpu"; }
  bool host_memory() const override { return false; }
  double bytes_to_host() const { return to_host_; }
  int synchronizations() const { return syncs_; }
  int blocking_downloads() const { return blocking_downloads_; }  // copy_to_host calls (they wait for the ops)
  void synchronize() override { ++syncs_; }
  // Markers on the host clock: this backend runs each op as it is called, so the time between two
  // calls is the time its ops took (the plumbing of the device timers, checked where no GPU is).
  int mark() override {
    marks_.push_back(std::chrono::steady_clock::now());
    return static_cast<int>(marks_.size()) - 1;
  }
  double marked_seconds(int from, int to) override {
    return std::chrono::duration<double>(marks_.at(static_cast<size_t>(to)) - marks_.at(static_cast<size_t>(from))).count();
  }
  void clear_marks() override { marks_.clear(); }
  size_t marks_held() const { return marks_.size(); }
  /// The LM head's row block (0: the CPU's).
  void set_head_rows(int rows) { head_rows_ = rows; }
  /// On: a GEMM input given in both forms is computed from its 16-bit one alone (widened), as a
  /// device's tensor-core path reads it, so a wrong 16-bit pointer changes the result. Counts the
  /// inputs that came with a 16-bit form either way.
  void prefer_half(bool on) { prefer_half_ = on; }
  /// On: asks the model to keep its GEMM inputs in 16 bits, as the CUDA backend does in 16-bit runs
  /// (OpsBackend::half_activations); the CPU ops write them through a rounded copy.
  void set_half_activations(bool on) { half_activations_ = on; }
  /// On (with set_half_activations): asks the model to keep its GELU MLPs' pre-activations in 16
  /// bits too (OpsBackend::half_pre_activations); the default ops round and widen them.
  void set_half_pre_activations(bool on) { half_pre_ = on; }
  bool half_pre_activations(kernels::Precision p) const override { return half_pre_ && p != kernels::Precision::fp32; }
  /// Whether a model keeps its LM head's logits in 16 bits (OpsBackend::half_logits); the default
  /// ops widen, compute in fp32 and round.
  void set_half_logits(bool on) { half_logits_ = on; }
  bool half_logits(kernels::Precision p) const override { return half_logits_ && p != kernels::Precision::fp32; }
  bool half_activations(kernels::Precision p) const override {
    return half_activations_ && p != kernels::Precision::fp32;
  }
  long long half_operands() const { return half_operands_; }
  int head_rows(int columns, int logit_bytes) const override {
    return head_rows_ > 0 ? head_rows_ : in_->head_rows(columns, logit_bytes);
  }

  void* allocate(size_t bytes) override {
    void* p = in_->allocate(bytes);
    if (p) live_[static_cast<const char*>(p)] = bytes;
    return p;
  }
  void release(void* p) noexcept override {
    if (auto it = live_.find(static_cast<const char*>(p)); it != live_.end())
      for (const Copy& c : queued_[0])  // a device gradient freed under its download: a bug to see
        if (!c.applied && static_cast<const char*>(c.src) >= it->first &&
            static_cast<const char*>(c.src) < it->first + it->second)
          ++freed_under_transfer_;
    live_.erase(static_cast<const char*>(p));
    in_->release(p);
  }
  /// p lies inside memory this backend allocated and has not released ("device memory").
  bool owns(const void* p) const {
    const char* c = static_cast<const char*>(p);
    auto it = live_.upper_bound(c);
    if (it == live_.begin()) return false;
    --it;
    return c < it->first + it->second;
  }
  void zero(void* p, size_t bytes) override { in_->zero(p, bytes); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { in_->copy_from_host(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    ++blocking_downloads_;
    to_host_ += double(bytes);
    in_->copy_to_host(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override { in_->copy(dst, src, bytes); }
  /// Reports this much device memory (device_memory()); 0 total: none (as the CPU).
  void set_device_memory(size_t free_bytes, size_t total_bytes) { free_ = free_bytes, total_ = total_bytes; }
  bool device_memory(size_t* free_bytes, size_t* total_bytes) const override {
    if (!total_) return false;
    *free_bytes = free_, *total_bytes = total_;
    return true;
  }
  void defer_transfers(bool on) { defer_ = on; }
  /// On: pin_host succeeds (and is counted until unpin_host), as the CUDA backend's host
  /// registration, so ZeRO-Offload's store uploads straight from the engine's 16-bit copies (a
  /// deferred upload then reads them only when it is waited for).
  void allow_pinning(bool on) { pinning_ = on; }
  bool pin_host(void* p, size_t bytes) override {
    if (!pinning_ || !p || !bytes) return false;
    pins_[p] = bytes;
    return true;
  }
  void unpin_host(void* p) noexcept override { pins_.erase(p); }
  size_t pins_held() const { return pins_.size(); }
  int transfers() const { return transfers_; }  // deferred transfers queued since construction
  int freed_under_transfer() const { return freed_under_transfer_; }  // releases of a download's pending source
  /// Uploads whose host source changed between the upload's issue and its copy: a device's DMA may
  /// read it at any time in between, so that is a race (the engine writing what is being uploaded).
  int changed_under_upload() const { return changed_under_upload_; }
  Transfer download_async(void* dst, const void* src, size_t bytes) override {
    if (!defer_) return OpsBackend::download_async(dst, src, bytes);
    if (!owns(src)) throw std::logic_error("staged-cpu: a download from memory the backend does not own");
    to_host_ += double(bytes);
    return queue(0, dst, src, bytes);
  }
  Transfer upload_async(void* dst, const void* src, size_t bytes) override {
    if (!defer_) return OpsBackend::upload_async(dst, src, bytes);
    if (!owns(dst)) throw std::logic_error("staged-cpu: an upload to memory the backend does not own");
    return queue(1, dst, src, bytes);
  }
  bool transfer_done(Transfer t) override { return t == 0 || (t >> 1) <= done_[t & 1]; }
  void wait_transfer(Transfer t) override { complete(t, true); }
  // The ops after it see the copy, but the host may not yet reuse its source: the copy is made
  // again, from the source as it is then, when a wait reaches it.
  void await_transfer(Transfer t) override { complete(t, false); }
  void widen_half(float* dst, const uint16_t* src, size_t n, kernels::Precision p) override {
    in_->widen_half(dst, src, n, p);
  }
  void accumulate_half(uint16_t* acc, const float* src, size_t n, kernels::Precision p) override {
    in_->accumulate_half(acc, src, n, p);
  }
  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       const int32_t* pos) override {
    in_->encoder_forward(out, tokens, wte, wpe, B, T, C, pos);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                        const int32_t* pos) override {
    in_->encoder_backward(dwte, dwpe, dout, tokens, B, T, C, pos);
  }
  void layernorm_forward(kernels::Output out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                         int N, int C) override {
    in_->layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int N, int C) override {
    in_->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void rmsnorm_forward(kernels::Output out, float* rstd, const float* inp, const float* weight, int N, int C) override {
    in_->rmsnorm_forward(out, rstd, inp, weight, N, C);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, int N, int C) override {
    in_->rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void matmul_forward(float* out, kernels::Operand inp, kernels::Operand weight, const float* bias, int N, int C, int OC,
                      kernels::Precision p) override {
    in_->matmul_forward(out, pick(inp), pick(weight), bias, N, C, OC, p);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, kernels::Operand inp,
                       kernels::Operand weight, int N, int C, int OC, kernels::Precision p) override {
    in_->matmul_backward(dinp, dweight, dbias, dout, pick(inp), pick(weight), N, C, OC, p);
  }
  /// On: the attention kernel keeps its inputs, as a fused one does (AttentionKernel::keeps_inputs):
  /// forward copies qkv after the CPU kernel's state and backward reads that copy, never the qkv
  /// it is passed, so a model that reuses its qkv buffer across layers still computes the same.
  void set_attention_keeps_inputs(bool on) { keeps_inputs_ = on; }
  /// On: the attention kernel says it computes its gradient in 16 bits (AttentionKernel::
  /// half_gradient, as cuDNN's), in 16-bit ops; the default attention_backward_into then rounds the
  /// CPU kernel's fp32 gradient once where a model asks for it in 16 bits.
  void set_attention_half_gradient(bool on) { half_gradient_ = on; }
  kernels::AttentionKernel attention_kernel(int B, int T, int C, int NH, kernels::Precision p,
                                           kernels::AttentionUse use) const override {
    kernels::AttentionKernel k = in_->attention_kernel(B, T, C, NH, p, use);
    k.keeps_inputs = keeps_inputs_;
    k.half_gradient = half_gradient_ && p != kernels::Precision::fp32;
    return k;
  }
  void allow_fused_attention(bool allow) override { in_->allow_fused_attention(allow); }
  size_t attention_state_floats(int B, int T, int C, int NH, kernels::Precision p,
                                kernels::AttentionUse use) const override {
    return in_->attention_state_floats(B, T, C, NH, p, use) + (keeps_inputs_ ? (size_t)B * T * 3 * C : 0);
  }
  /// On: the attention kernel reads forward's output in backward where its caller keeps it
  /// (AttentionUse::output_kept), as the fused one does: forward records the 16-bit output it wrote
  /// for each state, and backward compares the `out` it is given with that record, counting a
  /// missing, moved or changed one (output_mismatches).
  void set_attention_reads_output(bool on) { reads_output_ = on; }
  int output_mismatches() const { return output_mismatches_; }
  int outputs_read() const { return outputs_read_; }
  void attention_forward(kernels::Output out, float* att, const float* qkv, int B, int T, int C, int NH, kernels::Precision p,
                         const kernels::Dropout* drop, const int32_t* key_start, kernels::AttentionUse use) override {
    if (keeps_inputs_)
      std::memcpy(att + in_->attention_state_floats(B, T, C, NH, p, use), qkv, (size_t)B * T * 3 * C * sizeof(float));
    in_->attention_forward(out, att, qkv, B, T, C, NH, p, drop, key_start, use);
    if (reads_output_ && use.output_kept) {
      if (!out.h) ++output_mismatches_;
      else kept_out_[att] = {out.h, std::vector<uint16_t>(out.h, out.h + (size_t)B * T * C)};
    }
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, kernels::Operand out,
                          int B, int T, int C, int NH, kernels::Precision p, const kernels::Dropout* drop,
                          kernels::AttentionUse use) override {
    if (reads_output_ && use.output_kept) {
      ++outputs_read_;
      auto it = kept_out_.find(att);
      if (it == kept_out_.end() || out.h != it->second.first ||
          std::memcmp(out.h, it->second.second.data(), it->second.second.size() * sizeof(uint16_t)) != 0)
        ++output_mismatches_;
    }
    if (keeps_inputs_) qkv = att + in_->attention_state_floats(B, T, C, NH, p, use);
    in_->attention_backward(dqkv, dout, qkv, att, out, B, T, C, NH, p, drop, use);
  }
  void dropout(float* x, size_t rows, int C, const kernels::Dropout& d) override { in_->dropout(x, rows, C, d); }
  void gelu_forward(kernels::Output out, const float* inp, size_t n) override { in_->gelu_forward(out, inp, n); }
  void swiglu_forward(kernels::Output out, const float* inp, size_t rows, int F) override {
    in_->swiglu_forward(out, inp, rows, F);
  }
  void expand_kv(float* out, const float* inp, size_t rows, int C, int NH, int KV) override {
    in_->expand_kv(out, inp, rows, C, NH, KV);
  }
  void reduce_kv(float* dinp, const float* dout, size_t rows, int C, int NH, int KV) override {
    in_->reduce_kv(dinp, dout, rows, C, NH, KV);
  }
  void rope(float* qkv, int B, int T, int C, int NH, int KV, int rot, float theta, const int32_t* pos,
            bool inverse) override {
    in_->rope(qkv, B, T, C, NH, KV, rot, theta, pos, inverse);
  }
  void swiglu_backward(float* dinp, const float* inp, const float* dout, size_t rows, int F) override {
    in_->swiglu_backward(dinp, inp, dout, rows, F);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    in_->gelu_backward(dinp, inp, dout, n);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) override {
    in_->residual_forward(out, a, b, n);
  }
  void add_scaled(float* y, const float* x, float a, size_t n) override { in_->add_scaled(y, x, a, n); }
  void softmax_cross_entropy(float* logits_inout, float* losses, const int32_t* targets, float dloss, int N, int V,
                             int Vp) override {
    in_->softmax_cross_entropy(logits_inout, losses, targets, dloss, N, V, Vp);
  }
  void vocab_rows(float* out, const float* part, const int32_t* ids, size_t N, int width, int first,
                  int count) override {
    in_->vocab_rows(out, part, ids, N, width, first, count);
  }
  void vocab_rows_backward(float* dpart, const float* dout, const int32_t* ids, size_t N, int width, int first,
                           int count) override {
    in_->vocab_rows_backward(dpart, dout, ids, N, width, first, count);
  }
  void add_position_rows(float* out, const float* wpe, const int32_t* pos, size_t first, size_t rows, int T,
                         int C) override {
    in_->add_position_rows(out, wpe, pos, first, rows, T, C);
  }
  void vocab_ce_max(float* mx, const float* logits, int rows, int vl, int valid) override {
    in_->vocab_ce_max(mx, logits, rows, vl, valid);
  }
  void vocab_ce_sums(double* sums, const float* logits, const float* mx, const int32_t* targets, int rows, int vl,
                     int vstart, int valid) override {
    in_->vocab_ce_sums(sums, logits, mx, targets, rows, vl, vstart, valid);
  }
  void vocab_ce_finish(float* logits, float* losses, const float* mx, const double* sums, const int32_t* targets,
                       float dloss, int rows, int vl, int vstart, int valid, bool backward) override {
    in_->vocab_ce_finish(logits, losses, mx, sums, targets, dloss, rows, vl, vstart, valid, backward);
  }
  void gather_rows(float* dst, const float* src, const int32_t* rows, size_t n, int C) override {
    in_->gather_rows(dst, src, rows, n, C);
  }
  void scatter_rows(float* dst, const float* src, const int32_t* rows, size_t n, int C) override {
    in_->scatter_rows(dst, src, rows, n, C);
  }
  void moe_combine(float* out, const float* y, const int32_t* pos, const float* weight, int N, int K, int C) override {
    in_->moe_combine(out, y, pos, weight, N, K, C);
  }
  void moe_combine_backward(float* dy, float* dweight, const float* dout, const float* y, const int32_t* pos,
                            const float* weight, int N, int K, int C) override {
    in_->moe_combine_backward(dy, dweight, dout, y, pos, weight, N, K, C);
  }
  void moe_dispatch_backward(float* dx, const float* drows, const int32_t* pos, int N, int K, int C) override {
    in_->moe_dispatch_backward(dx, drows, pos, N, K, C);
  }
  void multiply(float* out, const float* a, const float* b, size_t n, bool accumulate) override {
    in_->multiply(out, a, b, n, accumulate);
  }
  void residual_mix(float* out, float* coef, const float* moe, const float* dense, int N, int C) override {
    in_->residual_mix(out, coef, moe, dense, N, C);
  }
  void residual_mix_backward(float* dmoe, float* ddense, float* dlogits, const float* dout, const float* coef,
                             const float* moe, const float* dense, int N, int C) override {
    in_->residual_mix_backward(dmoe, ddense, dlogits, dout, coef, moe, dense, N, C);
  }

 private:
  kernels::Operand pick(kernels::Operand x) {
    if (!x.h) return x;
    ++half_operands_;
    return prefer_half_ ? kernels::Operand::half(x.h) : x;
  }
  bool prefer_half_ = false, half_activations_ = false, half_logits_ = false;
  long long half_operands_ = 0;
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
    bool applied = false;  // a download the ops were ordered after (await_transfer): its source was read
    std::vector<char> issued;  // an upload: its source as it was when issued
  };
  void copy_out(const Copy& c, int dir) {
    if (dir == 1 && std::memcmp(c.src, c.issued.data(), c.bytes) != 0) ++changed_under_upload_;
    std::memcpy(c.dst, c.src, c.bytes);
  }
  Transfer queue(int dir, void* dst, const void* src, size_t bytes) {
    Copy c{dst, src, bytes, false, {}};
    if (dir == 1) c.issued.assign(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    queued_[dir].push_back(std::move(c));
    ++transfers_;
    return (++issued_[dir]) << 1 | Transfer(dir);
  }
  void complete(Transfer t, bool done) {
    if (t == 0) return;
    const int dir = static_cast<int>(t & 1);
    if ((t >> 1) > issued_[dir]) throw std::logic_error("staged-cpu: a transfer ticket never issued");
    if (!done) {  // copy those up to t, keep them queued (an upload is copied again when waited for)
      for (Transfer seq = done_[dir] + 1; seq <= (t >> 1); ++seq) {
        Copy& c = queued_[dir][static_cast<size_t>(seq - done_[dir] - 1)];
        if (c.applied) continue;
        copy_out(c, dir);
        c.applied = dir == 0;  // the ops after it may free a download's source now
      }
      return;
    }
    while (done_[dir] < (t >> 1)) {
      const Copy c = std::move(queued_[dir].front());
      queued_[dir].pop_front();
      ++done_[dir];
      if (c.applied) continue;
      if (dir == 0 && !owns(c.src)) throw std::logic_error("staged-cpu: a download's source was freed before it was done");
      copy_out(c, dir);
    }
  }
  size_t free_ = 0, total_ = 0;
  bool defer_ = false;
  int transfers_ = 0, freed_under_transfer_ = 0, changed_under_upload_ = 0;
  std::deque<Copy> queued_[2];  // 0: downloads, 1: uploads
  Transfer issued_[2] = {0, 0}, done_[2] = {0, 0};
  std::unique_ptr<kernels::OpsBackend> in_;
  std::map<const char*, size_t> live_;  // allocations: start -> bytes
  std::vector<std::chrono::steady_clock::time_point> marks_;
  int head_rows_ = 0;
  bool keeps_inputs_ = false, half_gradient_ = false, half_pre_ = false, pinning_ = false, reads_output_ = false;
  int output_mismatches_ = 0, outputs_read_ = 0;
  std::map<const float*, std::pair<const uint16_t*, std::vector<uint16_t>>> kept_out_;  // state -> output written
  std::map<void*, size_t> pins_;
  double to_host_ = 0;
  int syncs_ = 0, blocking_downloads_ = 0;
};

}  // namespace hpct::test
