// hpct/kernels/ops_backend.hpp — the model's ops and their memory behind one interface, so the same
// model code runs on the CPU (ops.hpp) or on a CUDA device (cuda_ops.hpp).
//
// What it is: every op the GPT forward and backward use, with ops.hpp's contracts (row-major fp32,
// backward ACCUMULATES), plus the memory calls the model needs around them: allocate and zero
// buffers in the backend's memory, copy tokens in and losses out. Pointers passed to an op are in
// the backend's memory: host memory for cpu_ops(), device memory for cuda_ops().
// What it is not: a tensor library or a stream scheduler. A device backend queues its ops on one
// stream in call order; copy_to_host() waits for everything queued before it.
// Trade-off: one virtual call per op (a few per layer, nothing per element) buys one model source
// for every backend; the CPU backend forwards to ops.hpp unchanged, so its results are bitwise those
// of the functions themselves.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "hpct/kernels/dropout.hpp"
#include "hpct/kernels/moe_gate.hpp"
#include "hpct/kernels/operand.hpp"
#include "hpct/kernels/optim.hpp"
#include "hpct/kernels/precision.hpp"

namespace hpct::kernels {

/// What one model's attention calls may ask of the op beyond the causal mask: the backend picks its
/// kernel (and so the layout of the state it keeps) from this, the shape and the precision.
struct AttentionUse {
  float dropout = 0.0f;       // the attention dropout calls may use (--attention-dropout; 0: none)
  bool per_document = false;  // key_start may be passed (--reset-attention-mask)
  /// The caller keeps forward's output in p's 16 bits (written as Output::half), unchanged until
  /// backward, and passes it there (attention_backward's `out`): a kernel whose backward reads its
  /// output (the fused one) then keeps no copy of it in its state.
  bool output_kept = false;
};
/// The attention kernel a backend runs for a shape: fused (flash-class: no T x T matrix kept) or
/// the materialised one, and what it is in words (with the reason where the fused one does not serve).
struct AttentionKernel {
  bool fused = false;
  std::string what;
  /// The state attention_forward saves holds what the backward needs of its qkv input (the fused
  /// kernel's 16-bit copy): attention_backward then never reads qkv, so the caller need not keep it.
  bool keeps_inputs = false;
  /// The kernel computes its input gradient in p's 16 bits (cuDNN's): attention_backward_into then
  /// writes a 16-bit dqkv as it is, with nothing lost (its fp32 form would be those values widened).
  bool half_gradient = false;
};

class OpsBackend {
 public:
  virtual ~OpsBackend() = default;
  /// "cpu", or "cuda:<device> (<name>)".
  virtual std::string name() const = 0;
  /// True when op pointers are host memory (the CPU backend): callers may read results directly.
  virtual bool host_memory() const = 0;
  /// True when this backend computes faster from 16-bit GEMM inputs, so that a model should keep
  /// the activations its GEMMs read (the norms', attention's and the MLP activation's outputs) in
  /// p's 16 bits (operand.hpp's Output): the CUDA backend in bf16/fp16 ops. The CPU: never (it
  /// rounds inside the GEMM, and 16-bit storage would cost it conversions).
  virtual bool half_activations(Precision /*p*/) const { return false; }
  /// True when a model keeping its GEMM inputs in 16 bits should also keep its GELU MLP's
  /// pre-activation (fc's output, which only GELU and its backward read) in p's 16 bits, as
  /// autocast does: half that (N, 4C) array's bytes kept and moved, at the cost of GELU reading the
  /// rounded value, so no longer bitwise the fp32 layout (the CUDA backend in bf16/fp16 ops).
  virtual bool half_pre_activations(Precision /*p*/) const { return false; }
  /// Bytes the backend holds itself for its ops (the CUDA attention backward's scratch), for reports.
  virtual size_t scratch_bytes() const { return 0; }
  /// A device backend's memory now: free and total bytes (the CUDA one: cudaMemGetInfo); false where
  /// the backend's memory is the host's (nothing written).
  virtual bool device_memory(size_t* /*free_bytes*/, size_t* /*total_bytes*/) const { return false; }

  // ---- memory (bytes; every allocation is aligned for any element type) ----
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  /// dst (backend memory) <- src (host memory). The host buffer may be reused when this returns.
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  /// dst (host memory) <- src (backend memory), after every op queued before; returns when done.
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  /// dst <- src, both in backend memory (queued like an op; the ranges must not overlap).
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  /// Returns when every op queued before has finished (a device backend's stream drained), so
  /// another stream (NCCL's) may read what they wrote. Nothing to wait for on the host.
  virtual void synchronize() {}
  /// The device queue the ops run on, for another library to order its work against without the
  /// host waiting (the CUDA backend: its cudaStream_t, as comm::DeviceCollectives' start_* and join
  /// take it); nullptr where each op is done when it returns.
  virtual void* queue_handle() { return nullptr; }

  // ---- transfers beside the ops (ZeRO-Offload's hand-over) ----
  // A device backend runs these on copy queues of their own (one per direction, each in call order),
  // so the ops queued after a transfer run while it is under way. Defaults, for backends whose
  // memory the host addresses: the copies above, done when they return.
  /// Host memory the transfers read and write at full speed (the CUDA backend: page-locked), aligned
  /// for any element type; freed with release_host.
  virtual void* allocate_host(size_t bytes);
  virtual void release_host(void* p) noexcept;
  /// Makes `bytes` of host memory the caller allocated (and keeps) transferable at full speed, so
  /// the transfers below may read and write it directly rather than through allocate_host memory
  /// (the CUDA backend: cudaHostRegister); true when done. unpin_host(p) undoes it, before the
  /// memory is freed. Default: false (the transfers are plain copies: nothing to gain).
  virtual bool pin_host(void* /*p*/, size_t /*bytes*/) { return false; }
  virtual void unpin_host(void* /*p*/) noexcept {}
  /// A queued transfer (0: done when queued).
  using Transfer = uint64_t;
  /// dst (host) <- src (backend memory), after every op queued before. dst may be read, and src
  /// changed or released, only once transfer_done(t) or wait_transfer(t) says it has finished.
  virtual Transfer download_async(void* dst, const void* src, size_t bytes);
  /// dst (backend memory) <- src (host), after every op queued before. Ops read dst only if queued
  /// after await_transfer(t); src may be changed once the transfer has finished.
  virtual Transfer upload_async(void* dst, const void* src, size_t bytes);
  /// True when transfer t has finished (never waits).
  virtual bool transfer_done(Transfer /*t*/) { return true; }
  /// Returns when transfer t has finished.
  virtual void wait_transfer(Transfer /*t*/) {}
  /// The ops queued from now on run after transfer t; the host does not wait.
  virtual void await_transfer(Transfer /*t*/) {}
  /// Device time, for the phase timers: a marker queued on the backend's stream (an index), and the
  /// seconds between two markers once the later one is reached (waiting for it). -1: this backend
  /// runs each op as it is called (the CPU), so the host's clock already is its time.
  /// clear_marks() forgets them all (once a step; indices start again at 0).
  /// Rows of the LM head the model computes at once (logits, loss and their gradient) for a head of
  /// `columns` vocabulary columns of `logit_bytes` each (4, or 2 where the logits are 16-bit): more
  /// rows re-read the head's weight gradient fewer times and launch fewer kernels, at rows x columns
  /// logits. The CPU's 256 keep them in cache.
  virtual int head_rows(int /*columns*/, int /*logit_bytes*/) const { return 256; }
  virtual int mark() { return -1; }
  virtual double marked_seconds(int /*from*/, int /*to*/) { return 0; }
  virtual void clear_marks() {}

  /// dst = the fp32 values of n 16-bit src values (p: bf16 or fp16), both in backend memory, as
  /// half.hpp's from_half does on the host (exact: every 16-bit value is an fp32 value).
  virtual void widen_half(float* dst, const uint16_t* src, size_t n, Precision p) = 0;
  /// acc = acc + src rounded to 16 bits (p: bf16 or fp16, round to nearest even), element by
  /// element, both in backend memory, bitwise as half.hpp's accumulate_half does on the host (a NaN
  /// stays a NaN, its payload may differ): a 16-bit gradient accumulator.
  virtual void accumulate_half(uint16_t* acc, const float* src, size_t n, Precision p) = 0;

  // ---- the optimizer step and its reductions (optim.hpp), on the backend's memory ----
  // Defaults: the host functions, for backends whose memory the host addresses (the CPU backend,
  // the test backends); a device backend overrides every one.
  /// AdamW on every run: the runs array in host memory, its pointers in backend memory; sums (host
  /// memory, 3 doubles) as in adamw_runs.
  virtual void adamw(const AdamwRun* runs, size_t count, const AdamwArgs& a, double* sums);
  /// sum(x^2) in double of n fp32 values in backend memory, after every op queued before (a device
  /// backend waits for it: the value comes back to the host).
  virtual double sum_squares(const float* x, size_t n);
  /// The same of n 16-bit values (p: bf16 or fp16), as optim.hpp's sum_of_squares_half.
  virtual double sum_squares_half(const uint16_t* x, size_t n, Precision p);
  /// How many of n fp32 / 16-bit values in backend memory are zero, as optim.hpp's count_zeros
  /// (--log-num-zeros-in-grad); after every op queued before.
  virtual double count_zeros(const float* x, size_t n);
  virtual double count_zeros_half(const uint16_t* x, size_t n);
  /// dst = src rounded to 16 bits (p: bf16 or fp16), as half.hpp's to_half.
  virtual void narrow_half(uint16_t* dst, const float* src, size_t n, Precision p);
  /// acc = 16-bit(acc + x), two 16-bit arrays added in fp32, as half.hpp's add_half.
  virtual void add_half(uint16_t* acc, const uint16_t* x, size_t n, Precision p);

  // ---- the GPT ops: contracts as in ops.hpp ----
  /// pos: per-token positions (nullptr: 0..T-1 in every sample), in backend memory.
  virtual void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                               int C, const int32_t* pos) = 0;
  virtual void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                                int C, const int32_t* pos) = 0;
  /// out: fp32, or 16-bit where the caller keeps GEMM inputs narrow (operand.hpp's Output; likewise
  /// every op below whose output a GEMM reads next: the norms, attention, GELU, SwiGLU).
  virtual void layernorm_forward(Output out, float* mean, float* rstd, const float* inp, const float* weight,
                                 const float* bias, int N, int C) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                  const float* weight, const float* mean, const float* rstd, int N, int C) = 0;
  /// RMSNorm (ops.hpp): rstd saved for backward; backward accumulates into dinp and dweight.
  virtual void rmsnorm_forward(Output out, float* rstd, const float* inp, const float* weight, int N, int C) = 0;
  virtual void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                                const float* rstd, int N, int C) = 0;
  /// inp (N, C) and weight (OC, C) in either form or both (operand.hpp); a 16-bit form is in p's
  /// format, so it is only ever given where p is bf16 or fp16. A backend computing from fp32 widens
  /// an input that has only its 16-bit form (exact), so every form gives the same product.
  virtual void matmul_forward(float* out, Operand inp, Operand weight, const float* bias, int N, int C, int OC,
                              Precision p) = 0;
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, Operand inp,
                               Operand weight, int N, int C, int OC, Precision p) = 0;
  /// Which attention kernel serves a model's calls of this shape (`use`: what they may ask beyond
  /// the causal mask), and in words for the start line. The same choice for the state's size,
  /// forward and backward.
  virtual AttentionKernel attention_kernel(int B, int T, int C, int NH, Precision p, AttentionUse use) const;
  /// Lets the backend pick a fused attention kernel where one serves (on by default; off: the
  /// materialised kernel always, as --attention-kernel plain). Nothing on a backend without one.
  virtual void allow_fused_attention(bool /*allow*/) {}
  /// Floats of the state attention_forward saves for attention_backward (`att` below), in the
  /// op's own layout: callers size it by this and never read it. The materialised kernel (the CPU's,
  /// the CUDA one) keeps the probabilities, B x NH x T x T; a fused (flash-class) kernel keeps the
  /// inputs it saw, its output (not where use.output_kept) and per-row statistics (attention_kernel
  /// says which).
  virtual size_t attention_state_floats(int B, int T, int C, int NH, Precision p, AttentionUse use) const {
    (void)C, (void)p, (void)use;
    return (size_t)B * NH * T * T;
  }
  /// att: attention_state_floats(B, T, C, NH, p, use) floats, written by forward, read by backward.
  /// drop: attention dropout (nullptr or p = 0: none; on only at use.dropout); pass the same to
  /// forward and backward. A fused kernel may draw its own mask (the CUDA one: cuDNN's), the same
  /// in forward and backward of one call's Dropout. key_start: each query's first key (per-document attention, only where
  /// use.per_document; nullptr: 0), in backend memory.
  virtual void attention_forward(Output out, float* att, const float* qkv, int B, int T, int C, int NH, Precision p,
                                 const Dropout* drop, const int32_t* key_start, AttentionUse use) = 0;
  /// qkv: forward's input, unread (and may be nullptr or hold other values) where attention_kernel
  /// says the kernel keeps its inputs. out: forward's output as the caller kept it, read only where
  /// use.output_kept (its 16-bit form; empty allowed elsewhere).
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, Operand out,
                                  int B, int T, int C, int NH, Precision p, const Dropout* drop, AttentionUse use) = 0;
  /// In place on (rows, C) token rows; the mask is dropout.hpp's, bitwise the same on every backend.
  virtual void dropout(float* x, size_t rows, int C, const Dropout& d) = 0;
  virtual void gelu_forward(Output out, const float* inp, size_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) = 0;
  /// Rotary position embedding on the q and k sections of qkv rows, in place (ops.hpp); pos in the
  /// backend's memory (nullptr: row % T).
  virtual void rope(float* qkv, int B, int T, int C, int NH, int KV, int rot, float theta, const int32_t* pos,
                    bool inverse) = 0;
  /// Grouped-query attention's key/value heads widened to every query head, and back (ops.hpp).
  virtual void expand_kv(float* out, const float* inp, size_t rows, int C, int NH, int KV) = 0;
  virtual void reduce_kv(float* dinp, const float* dout, size_t rows, int C, int NH, int KV) = 0;
  /// SwiGLU on rows of [gate | up] (ops.hpp); backward accumulates into dinp.
  virtual void swiglu_forward(Output out, const float* inp, size_t rows, int F) = 0;
  virtual void swiglu_backward(float* dinp, const float* inp, const float* dout, size_t rows, int F) = 0;
  virtual void residual_forward(float* out, const float* a, const float* b, size_t n) = 0;
  virtual void add_scaled(float* y, const float* x, float a, size_t n) = 0;

  // ---- fused forms: each is exactly the composite its comment names (the default here, so every
  // backend computes the same thing); a backend that can fuses it into fewer passes over memory ----
  /// res = a + b (residual_forward; res may be a or b), then out = layernorm(res) with mean and
  /// rstd saved (layernorm_forward): a transformer layer's residual add and the norm after it.
  virtual void residual_layernorm_forward(float* res, Output out, float* mean, float* rstd, const float* a,
                                          const float* b, const float* weight, const float* bias, int N, int C);
  /// res = a + b, then out = rmsnorm(res) with rstd saved.
  virtual void residual_rmsnorm_forward(float* res, Output out, float* rstd, const float* a, const float* b,
                                        const float* weight, int N, int C);
  /// pre = inp weight^T + bias (matmul_forward), then act = gelu(pre) (gelu_forward): an MLP's fc
  /// and its activation; both kept, as the backward reads pre. A 16-bit pre (p's format; see
  /// half_pre_activations) is the fp32 sum rounded once, and act is then GELU of that rounded value,
  /// as autocast's bf16 linear and GELU give; the fp32 sum goes through `wide` (N x OC floats of
  /// scratch, needed only there: nullptr otherwise).
  virtual void matmul_gelu_forward(Output pre, Output act, Operand inp, Operand weight, const float* bias,
                                   float* wide, int N, int C, int OC, Precision p);
  /// matmul_backward with dinp WRITTEN (its old contents ignored, as if zeroed first); dweight and
  /// dbias accumulate as there. Saves the memset before a gradient's first GEMM. dout in either
  /// form: fp32, or only its 16-bit values in p's format (a gradient kept in 16 bits, as
  /// gelu_backward_into writes one; the GEMMs round dout to p anyway, and dbias then sums the
  /// 16-bit values in fp32).
  virtual void matmul_backward_into(float* dinp, float* dweight, float* dbias, Operand dout, Operand inp,
                                    Operand weight, int N, int C, int OC, Precision p);
  /// attention_backward with dqkv WRITTEN (B*T rows of 3C, as if zeroed first): fp32, or 16-bit in
  /// p's format (the gradient rounded once: the qkv GEMMs read it as it is, as autocast's bf16
  /// attention gradient; lossless where attention_kernel says half_gradient).
  virtual void attention_backward_into(Output dqkv, const float* dout, const float* qkv, const float* att, Operand out,
                                       int B, int T, int C, int NH, Precision p, const Dropout* drop, AttentionUse use);
  /// dinp = gelu'(inp) * dout, WRITTEN (gelu_backward on a zeroed dinp). inp in either form (a
  /// 16-bit one in p's format: the pre-activation matmul_gelu_forward kept so); dinp fp32, or
  /// 16-bit in p's format (each value computed in fp32 and rounded once: the GEMMs after it read it).
  virtual void gelu_backward_into(Output dinp, Operand inp, const float* dout, size_t n, Precision p);
  /// As ops.hpp, except that targets are checked by the caller on a device backend (a kernel
  /// cannot throw): Gpt checks them on the host before they are copied in.
  virtual void softmax_cross_entropy(float* logits_inout, float* losses, const int32_t* targets, float dloss, int N,
                                     int V, int Vp) = 0;

  // ---- the LM head in 16 bits: logits, their cross entropy and its gradient ----
  /// True when a model should keep its LM head's logits in p's 16 bits (the CUDA backend in
  /// bf16/fp16 ops, as PyTorch's autocast does): the ops below then replace matmul_forward,
  /// softmax_cross_entropy and matmul_backward there. Defaults: the fp32 ops on widened and rounded
  /// copies, for backends whose memory the host addresses (the CPU never asks for them).
  virtual bool half_logits(Precision /*p*/) const { return false; }
  /// out (N, OC) = inp weight^T (no bias), rounded once to p's 16 bits (p: bf16 or fp16).
  virtual void matmul_forward_half(uint16_t* out, Operand inp, Operand weight, int N, int C, int OC, Precision p);
  /// softmax_cross_entropy (ops.hpp) on the fp32 values of 16-bit logits; the gradient written back
  /// rounded to 16 bits (padding columns and ignored rows 0), the losses fp32.
  virtual void softmax_cross_entropy_half(uint16_t* logits_inout, float* losses, const int32_t* targets, float dloss,
                                          int N, int V, int Vp, Precision p);
  /// matmul_backward (no bias; dinp and dweight accumulate, either may be null) from a 16-bit dout.
  virtual void matmul_backward_half(float* dinp, float* dweight, const uint16_t* dout, Operand inp, Operand weight,
                                    int N, int C, int OC, Precision p);

  // ---- the vocab-parallel embedding's and cross entropy's rows: contracts as in tp_ops.hpp ----
  virtual void vocab_rows(float* out, const float* part, const int32_t* ids, size_t N, int width, int first,
                          int count) = 0;
  virtual void vocab_rows_backward(float* dpart, const float* dout, const int32_t* ids, size_t N, int width, int first,
                                   int count) = 0;
  virtual void add_position_rows(float* out, const float* wpe, const int32_t* pos, size_t first, size_t rows, int T,
                                 int C) = 0;
  virtual void vocab_ce_max(float* mx, const float* logits, int rows, int vl, int valid) = 0;
  virtual void vocab_ce_sums(double* sums, const float* logits, const float* mx, const int32_t* targets, int rows,
                             int vl, int vstart, int valid) = 0;
  virtual void vocab_ce_finish(float* logits, float* losses, const float* mx, const double* sums,
                               const int32_t* targets, float dloss, int rows, int vl, int vstart, int valid,
                               bool backward) = 0;

  // ---- the MoE layer's row moves and mixes: contracts as in moe_ops.hpp ----
  virtual void gather_rows(float* dst, const float* src, const int32_t* rows, size_t n, int C) = 0;
  virtual void scatter_rows(float* dst, const float* src, const int32_t* rows, size_t n, int C) = 0;
  virtual void moe_combine(float* out, const float* y, const int32_t* pos, const float* weight, int N, int K,
                           int C) = 0;
  virtual void moe_combine_backward(float* dy, float* dweight, const float* dout, const float* y, const int32_t* pos,
                                    const float* weight, int N, int K, int C) = 0;
  virtual void moe_dispatch_backward(float* dx, const float* drows, const int32_t* pos, int N, int K, int C) = 0;
  virtual void multiply(float* out, const float* a, const float* b, size_t n, bool accumulate) = 0;
  virtual void residual_mix(float* out, float* coef, const float* moe, const float* dense, int N, int C) = 0;
  virtual void residual_mix_backward(float* dmoe, float* ddense, float* dlogits, const float* dout, const float* coef,
                                     const float* moe, const float* dense, int N, int C) = 0;

  // ---- the MoE gate on the backend's memory: contracts as in moe_gate.hpp ----
  // Defaults: the host functions, for backends whose memory the host addresses; the CUDA backend
  // runs kernels that reach the same routes. Nothing comes back by itself: the caller downloads
  // r.summary where it needs the counts (the experts' rows) or the losses.
  virtual void moe_gate_select(const GateRoutes& r, const float* logits, int N, const GateConfig& cfg, uint64_t seed,
                               bool training);
  /// With drop_tokens false, capacity must be at least the largest demand: the host function
  /// throws otherwise; a device's kernel cannot, so its caller checks.
  virtual void moe_gate_assign(const GateRoutes& r, int N, int capacity, const GateConfig& cfg, uint64_t seed);
  virtual void moe_gate_backward(float* dlogits, const GateRoutes& r, const float* logits, const float* dweight, int N,
                                 const GateConfig& cfg, float aux_coeff, float z_coeff);
};

/// The CPU backend: ops.hpp on host memory (64-byte aligned allocations). Needs a BackendScope
/// alive while its ops run, as ops.hpp does.
std::unique_ptr<OpsBackend> cpu_ops();

/// True when this build has the CUDA backend and a device can be used; otherwise false with the
/// reason in *why (e.g. "built without CUDA", "no CUDA device: ...").
bool cuda_ops_available(std::string* why = nullptr);
/// The CUDA backend on GPU `device` modulo the GPUs this process sees (so a node-local rank can be
/// passed as it is, also where each rank sees one GPU), set with cudaSetDevice on the calling thread:
/// kernels from cuda_ops.hpp and cuBLAS on one stream. Throws hpct::Error with the reason when
/// cuda_ops_available() is false or the device cannot be set up.
std::unique_ptr<OpsBackend> cuda_ops(int device = 0);

/// Memory a backend hands out, freed with it; moves, does not copy. Host = false: the backend's own
/// memory (allocate/release); true: host memory for its transfers (allocate_host/release_host).
template <bool Host>
class BufferOf {
 public:
  BufferOf() = default;
  BufferOf(OpsBackend& be, size_t bytes) : be_(&be), bytes_(bytes), p_(take(be, bytes)) {}
  ~BufferOf() { reset(); }
  BufferOf(BufferOf&& o) noexcept : be_(o.be_), bytes_(o.bytes_), p_(o.p_) { o.p_ = nullptr, o.bytes_ = 0; }
  BufferOf& operator=(BufferOf&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_, bytes_ = o.bytes_, p_ = o.p_;
      o.p_ = nullptr, o.bytes_ = 0;
    }
    return *this;
  }
  BufferOf(const BufferOf&) = delete;
  BufferOf& operator=(const BufferOf&) = delete;

  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }
  void reset() noexcept {
    if (p_) Host ? be_->release_host(p_) : be_->release(p_);
    p_ = nullptr, bytes_ = 0;
  }

 private:
  static void* take(OpsBackend& be, size_t bytes) {
    if (Host) return be.allocate_host(bytes);
    return bytes ? be.allocate(bytes) : nullptr;
  }
  OpsBackend* be_ = nullptr;
  size_t bytes_ = 0;
  void* p_ = nullptr;
};
/// A buffer in a backend's memory.
using BackendBuffer = BufferOf<false>;
/// Host memory from a backend's allocate_host (page-locked on a device).
using HostBuffer = BufferOf<true>;

}  // namespace hpct::kernels
