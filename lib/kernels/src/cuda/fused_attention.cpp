// The CUDA backend's fused attention as the backend runs it (fused_attention.hpp).
#include "fused_attention.hpp"

#include "hpct/core/error.hpp"
#include "hpct/kernels/cuda_ops.hpp"

namespace hpct::kernels::cuda {
namespace {

size_t up4(size_t n) { return (n + 3) / 4 * 4; }
size_t up256(size_t n) { return (n + 255) / 256 * 256; }
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

FusedShape shape_of(int B, int T, int C, int NH, Precision p, float dropout = 0, bool documents = false) {
  return {B, T, NH, C / NH, p == Precision::fp16, dropout, documents};
}

// cuDNN's generator seed for one call's attention dropout: the site key mixed with the
// micro-batch's first sample and this rank's first head (dropout.hpp's row key at query 0), so
// each micro-batch, layer and step draws its own mask, and a recompute or a resume the same one.
int64_t seed_of(const Dropout* drop) {
  if (!drop || !drop->on()) return 0;
  return static_cast<int64_t>(dropout_row_key(drop->key, drop->first_sample, dropout_attention_code(drop->head0, 0)) >> 1);
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error(std::string("CUDA backend: fused attention: ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace

// The state in att: 16-bit q, k, v rows as the forward read them, its 16-bit output (not where the
// caller keeps it: use.output_kept), the per-row statistics and, per document, each query's first
// key, each 16-byte aligned.
struct FusedAttention::State {
  uint16_t *qkv, *out;  // out: nullptr where use.output_kept
  float* stats;
  int32_t* keys;  // nullptr without per-document masks
};

FusedAttention::~FusedAttention() {
  cudnn_.reset();
  if (scratch_) cudaFreeAsync(scratch_, stream_);
}

void FusedAttention::allow(bool allow) {
  allow_ = allow;
  choice_.clear();
}

std::string FusedAttention::refusal(int B, int T, int C, int NH, Precision p, AttentionUse use) const {
  const auto key = std::make_tuple(C, NH, (int)p, use.dropout, use.per_document);
  if (auto it = choice_.find(key); it != choice_.end()) return it->second;
  std::string why;
  const int HS = C / NH;
  if (!allow_) why = "--attention-kernel plain";
  else if (p == Precision::fp32) why = "fp32 (it takes bf16 or fp16 inputs)";
  else if (C % NH != 0 || HS % 8 != 0 || HS > 128) why = "head size " + std::to_string(HS) + " (a multiple of 8 up to 128)";
  else if (sm_major_ < 8) why = "compute capability " + std::to_string(sm_major_) + ".x (needs 8.0 or newer)";
  else if (B <= 0 || T <= 0) return "an empty batch";  // not decided yet
  else {
    if (!tried_) {
      tried_ = true;
      cudnn_ = CudnnAttention::open(stream_, &why_);
    }
    // The plans without dropout (evaluation) and, where the calls may drop, with it.
    if (!cudnn_) why = why_;
    else if (std::string refused; !cudnn_->prepare(shape_of(B, T, C, NH, p, 0, use.per_document), &refused))
      why = refused;
    else if (use.dropout > 0 && !cudnn_->prepare(shape_of(B, T, C, NH, p, use.dropout, use.per_document), &refused))
      why = refused;
  }
  choice_[key] = why;
  return why;
}

std::string FusedAttention::describe(Precision p, AttentionUse use) const {
  return "cuDNN " + (cudnn_ ? cudnn_->version() : std::string("?")) +
         " fused attention (flash-class: no T x T scores kept), " + (p == Precision::fp16 ? "fp16" : "bf16") +
         " q, k, v" + (use.dropout > 0 ? "; attention dropout from cuDNN's generator (not the CPU's mask)" : "");
}

size_t FusedAttention::state_floats(int B, int T, int C, int NH, AttentionUse use) {
  const size_t N = (size_t)B * T;
  return 4 + up4((N * 3 * C + 1) / 2) + (use.output_kept ? 0 : up4((N * C + 1) / 2)) + up4(N * NH) +
         (use.per_document ? N : 0);
}

FusedAttention::State FusedAttention::state(float* att, int B, int T, int C, int NH, AttentionUse use) {
  const size_t N = (size_t)B * T;
  auto* base = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(att) + 15) & ~uintptr_t(15));
  float* out = base + up4((N * 3 * C + 1) / 2);
  float* stats = use.output_kept ? out : out + up4((N * C + 1) / 2);
  return {reinterpret_cast<uint16_t*>(base), use.output_kept ? nullptr : reinterpret_cast<uint16_t*>(out), stats,
          use.per_document ? reinterpret_cast<int32_t*>(stats + up4(N * NH)) : nullptr};
}

// The call's shape with its dropout (on only where `use` declared that probability), its plans built.
FusedShape FusedAttention::plan(int B, int T, int C, int NH, Precision p, const Dropout* drop, AttentionUse use) const {
  const float dropout = drop && drop->on() ? drop->p : 0.0f;
  if (dropout > 0 && dropout != use.dropout)
    throw Error("CUDA backend: attention dropout " + std::to_string(dropout) + " in a call declared with " +
                std::to_string(use.dropout));
  const FusedShape s = shape_of(B, T, C, NH, p, dropout, use.per_document);
  std::string why;
  if (!cudnn_->prepare(s, &why))
    throw Error("CUDA backend: cuDNN fused attention has no plan for B=" + std::to_string(B) + ", T=" +
                std::to_string(T) + (dropout > 0 ? " with dropout" : "") + " (" + why +
                "); --attention-kernel plain runs the materialised kernel");
  return s;
}

// A buffer kept between calls, grown (never shrunk), stream-ordered like the backend's.
void* FusedAttention::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    if (scratch_) cudaFreeAsync(scratch_, stream_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    check(cudaMallocAsync(&scratch_, bytes, stream_), ("cudaMallocAsync of " + std::to_string(bytes) + " bytes").c_str());
    scratch_bytes_ = bytes;
  }
  return scratch_;
}

void FusedAttention::forward(float* out, uint16_t* out16, float* att, const float* qkv, int B, int T, int C, int NH,
                             Precision p, const Dropout* drop, const int32_t* key_start, AttentionUse use) {
  if (key_start && !use.per_document)
    throw Error("CUDA backend: attention_forward: per-document keys in a call declared without them");
  const FusedShape s = plan(B, T, C, NH, p, drop, use);
  const State st = state(att, B, T, C, NH, use);
  const bool bf16 = p == Precision::bf16;
  narrow_half(st.qkv, qkv, (size_t)B * T * 3 * C, bf16, stream_);
  if (use.per_document) {  // kept for the backward; no keys given: every query's first key is 0
    const size_t bytes = (size_t)B * T * sizeof(int32_t);
    if (key_start) check(cudaMemcpyAsync(st.keys, key_start, bytes, cudaMemcpyDeviceToDevice, stream_), "the keys");
    else check(cudaMemsetAsync(st.keys, 0, bytes, stream_), "the keys");
  }
  const size_t n = (size_t)B * T * C;
  if (use.output_kept) {  // cuDNN writes the caller's 16-bit output (through the scratch where it is unaligned)
    if (!out16) throw Error("CUDA backend: attention_forward: a call whose caller keeps the output needs it in 16 bits");
    const bool direct = aligned16(out16);
    const size_t staged = direct ? 0 : up256(n * sizeof(uint16_t));
    char* w = static_cast<char*>(scratch(staged + cudnn_->forward_workspace(s)));
    uint16_t* o = direct ? out16 : reinterpret_cast<uint16_t*>(w);
    cudnn_->forward(s, st.qkv, o, st.stats, w + staged, seed_of(drop), st.keys);
    if (!direct) check(cudaMemcpyAsync(out16, o, n * sizeof(uint16_t), cudaMemcpyDeviceToDevice, stream_), "the output");
    return;
  }
  cudnn_->forward(s, st.qkv, st.out, st.stats, scratch(cudnn_->forward_workspace(s)), seed_of(drop), st.keys);
  if (out16) check(cudaMemcpyAsync(out16, st.out, n * sizeof(uint16_t), cudaMemcpyDeviceToDevice, stream_), "the output");
  else widen_half(out, st.out, n, bf16, stream_);
}

// q, k, v as the forward rounded them (its state); dout rounded here; the 16-bit gradient added to
// dqkv in fp32 (or written there: accumulate false), or left in 16 bits where the caller takes it so.
void FusedAttention::backward(float* dqkv, uint16_t* dqkv16, const float* dout, const float* att,
                              const uint16_t* kept16, int B, int T, int C, int NH, Precision p, const Dropout* drop,
                              AttentionUse use, bool accumulate) {
  if (dqkv16 && accumulate) throw Error("CUDA backend: fused attention: a 16-bit dqkv is written, not accumulated");
  if (use.output_kept && !kept16)
    throw Error("CUDA backend: attention_backward: a call whose caller keeps the output must pass it (`out`)");
  const FusedShape s = plan(B, T, C, NH, p, drop, use);
  const State st = state(const_cast<float*>(att), B, T, C, NH, use);
  const bool bf16 = p == Precision::bf16;
  // cuDNN writes a 16-bit dqkv the caller gives where it is 16-byte aligned (as the state's arrays),
  // elsewhere into the scratch, copied after; and reads the caller's kept output likewise (copied
  // into the scratch first where unaligned).
  const bool direct = dqkv16 && aligned16(dqkv16), out_direct = !use.output_kept || aligned16(kept16);
  const size_t n1 = (size_t)B * T * C, n3 = 3 * n1, a1 = up256(n1 * 2), a3 = direct ? 0 : up256(n3 * 2);
  const size_t ao = out_direct ? 0 : a1;
  char* w = static_cast<char*>(scratch(a1 + a3 + ao + cudnn_->backward_workspace(s)));
  auto* dout16 = reinterpret_cast<uint16_t*>(w);
  uint16_t* grad16 = direct ? dqkv16 : reinterpret_cast<uint16_t*>(w + a1);
  const uint16_t* o = use.output_kept ? kept16 : st.out;
  if (!out_direct) {
    auto* staged = reinterpret_cast<uint16_t*>(w + a1 + a3);
    check(cudaMemcpyAsync(staged, kept16, n1 * sizeof(uint16_t), cudaMemcpyDeviceToDevice, stream_), "the kept output");
    o = staged;
  }
  narrow_half(dout16, dout, n1, bf16, stream_);
  cudnn_->backward(s, st.qkv, o, dout16, st.stats, grad16, w + a1 + a3 + ao, seed_of(drop), st.keys);
  if (dqkv16) {
    if (!direct) check(cudaMemcpyAsync(dqkv16, grad16, n3 * sizeof(uint16_t), cudaMemcpyDeviceToDevice, stream_), "dqkv");
    return;
  }
  if (accumulate) add_widened(dqkv, grad16, n3, bf16, stream_);
  else widen_half(dqkv, grad16, n3, bf16, stream_);
}

}  // namespace hpct::kernels::cuda
