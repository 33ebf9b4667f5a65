// cuDNN's fused causal attention through the graph API (cudnn_attention.hpp).
//
// The graphs are the composite ones cudnn-frontend builds for cuDNN 9 before its native SDPA node
// takes causal masks (9.21): forward S = scale Q K^T, the causal mask as GEN_INDEX row >= col and a
// BINARY_SELECT of -inf, the softmax as max / sub / exp / sum reductions with the row statistic
// max + log(sum) written out, O = P V; backward the row sums of dO * O, P recomputed from the
// statistic, dV = P^T dO, dS = P (dO V^T - rowsum) scale, dK = dS^T Q, dQ = dS K through an fp32
// accumulator. K and V enter transposed (their strides swapped), as the backend expects.
#include "cudnn_attention.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "cudnn_graph.hpp"

#include "hpct/core/error.hpp"
#include "hpct/kernels/cuda_ops.hpp"

namespace hpct::kernels::cuda {

using cudnn::Desc;
using cudnn::Dims;
using cudnn::Graph;
using cudnn::build;
using cudnn::execute;

namespace {

// The tensors' unique ids (the variant pack's keys).
enum Uid : int64_t {
  Q = 1, K, V, O, STATS, SCALE, NEG_INF, DO, DQ, DK, DV, KEEP, ROW_SUM, DQ_ACC, SEED, OFFSET, DROP_SCALE, KEY_START
};

struct Layout {  // the packed qkv rows read in place: element strides of (B, NH, T, HS) views
  int64_t B, NH, T, HS, C;
  Dims qkv() const { return {T * 3 * C, HS, 3 * C, 1}; }           // q, k, v, dq, dk, dv: (B, T, 3, NH, HS)
  Dims qkv_t() const { return {T * 3 * C, HS, 1, 3 * C}; }         // k^T, v^T: (B, NH, HS, T)
  Dims out() const { return {T * C, HS, C, 1}; }                   // o, do: (B, T, NH, HS)
  Dims bhtt() const { return {NH * T * T, T * T, T, 1}; }          // scores
  Dims bhtt_t() const { return {NH * T * T, T * T, 1, T}; }        // scores transposed
  Dims bht1() const { return {NH * T, T, 1, 1}; }                  // per-row statistics
  Dims bhtd() const { return {NH * T * HS, T * HS, HS, 1}; }       // the fp32 dq accumulator
  Dims tt() const { return {B, NH, T, T}; }
  Dims td() const { return {B, NH, T, HS}; }
  Dims dt() const { return {B, NH, HS, T}; }
  Dims t1() const { return {B, NH, T, 1}; }
};

Layout layout_of(const FusedShape& s) { return {s.B, s.NH, s.T, s.HS, (int64_t)s.NH * s.HS}; }

// The causal mask on scores x (T x T per head): y = row >= col ? x : -inf; per document then also
// -inf where col < key_start[row] (an int32 (B, 1, T, 1) tensor broadcast over heads and keys).
cudnnBackendDescriptor_t causal(Graph& g, const Layout& l, const FusedShape& s, cudnnBackendDescriptor_t x,
                                cudnnBackendDescriptor_t neg) {
  auto row = g.virt(CUDNN_DATA_INT32, l.tt(), l.bhtt()), col = g.virt(CUDNN_DATA_INT32, l.tt(), l.bhtt());
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, row, nullptr, nullptr, CUDNN_DATA_FLOAT, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, col, nullptr, nullptr, CUDNN_DATA_FLOAT, 3);
  auto keep = g.virt(CUDNN_DATA_BOOLEAN, l.tt(), l.bhtt());
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, keep, col, nullptr, CUDNN_DATA_BOOLEAN);
  auto y = g.virt(CUDNN_DATA_FLOAT, l.tt(), l.bhtt());
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, y, neg, keep);
  if (s.documents) {
    // A second select, not a LOGICAL_AND of the two masks: cuDNN 9.19's flash kernel generator
    // takes no AND of a loaded mask (measured offline), nor fp32 keys.
    auto first = g.tensor(KEY_START, CUDNN_DATA_INT32, {l.B, 1, l.T, 1}, {l.T, l.T, 1, 1}, false);
    auto in_doc = g.virt(CUDNN_DATA_BOOLEAN, l.tt(), l.bhtt());
    g.pointwise(CUDNN_POINTWISE_CMP_GE, col, in_doc, first, nullptr, CUDNN_DATA_BOOLEAN);
    auto y2 = g.virt(CUDNN_DATA_FLOAT, l.tt(), l.bhtt());
    g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, y, y2, neg, in_doc);
    y = y2;
  }
  return y;
}

// Attention dropout's keep mask (1 with probability 1 - p), regenerated alike in the backward: the
// same generator, seed and offset over the same (B, NH, T, T) elements.
cudnnBackendDescriptor_t dropout_mask(Graph& g, const Layout& l, const FusedShape& s) {
  auto mask = g.virt(CUDNN_DATA_FLOAT, l.tt(), l.bhtt());
  g.rng(1.0 - (double)s.dropout, g.scalar(SEED, CUDNN_DATA_INT64), g.scalar(OFFSET, CUDNN_DATA_INT64), mask);
  return mask;
}

void forward_graph(Graph& g, const FusedShape& s) {
  const Layout l = layout_of(s);
  const cudnnDataType_t io = s.fp16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
  const cudnnDataType_t f = CUDNN_DATA_FLOAT;
  auto q = g.tensor(Q, io, l.td(), l.qkv(), false), kt = g.tensor(K, io, l.dt(), l.qkv_t(), false);
  auto v = g.tensor(V, io, l.td(), l.qkv(), false), o = g.tensor(O, io, l.td(), l.out(), false);
  auto stats = g.tensor(STATS, f, l.t1(), l.bht1(), false);
  auto scale = g.scalar(SCALE), neg = g.scalar(NEG_INF);
  auto s0 = g.virt(f, l.tt(), l.bhtt()), s1 = g.virt(f, l.tt(), l.bhtt());
  g.matmul(q, kt, s0);
  g.pointwise(CUDNN_POINTWISE_MUL, s0, s1, scale);
  auto s2 = causal(g, l, s, s1, neg);
  auto mx = g.virt(f, l.t1(), l.bht1()), z = g.virt(f, l.tt(), l.bhtt()), e = g.virt(f, l.tt(), l.bhtt());
  g.reduce(CUDNN_REDUCE_TENSOR_MAX, s2, mx);
  g.pointwise(CUDNN_POINTWISE_SUB, s2, z, mx);
  g.pointwise(CUDNN_POINTWISE_EXP, z, e);
  auto sum = g.virt(f, l.t1(), l.bht1()), logsum = g.virt(f, l.t1(), l.bht1());
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, logsum);
  g.pointwise(CUDNN_POINTWISE_ADD, mx, stats, logsum);
  auto p = g.virt(io, l.tt(), l.bhtt());  // the backend takes the second matmul's A in the i/o type
  if (s.dropout > 0) {  // P * mask / (1 - p)
    auto p0 = g.virt(f, l.tt(), l.bhtt()), pm = g.virt(f, l.tt(), l.bhtt()), mask = dropout_mask(g, l, s);
    g.pointwise(CUDNN_POINTWISE_DIV, e, p0, sum);
    g.pointwise(CUDNN_POINTWISE_MUL, p0, pm, mask);
    g.pointwise(CUDNN_POINTWISE_MUL, pm, p, g.scalar(DROP_SCALE));
  } else {
    g.pointwise(CUDNN_POINTWISE_DIV, e, p, sum);
  }
  g.matmul(p, v, o);
}

void backward_graph(Graph& g, const FusedShape& s) {
  const Layout l = layout_of(s);
  const cudnnDataType_t io = s.fp16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
  const cudnnDataType_t f = CUDNN_DATA_FLOAT;
  auto q = g.tensor(Q, io, l.td(), l.qkv(), false), kt = g.tensor(K, io, l.dt(), l.qkv_t(), false);
  auto vt = g.tensor(V, io, l.dt(), l.qkv_t(), false), o = g.tensor(O, io, l.td(), l.out(), false);
  auto dout = g.tensor(DO, io, l.td(), l.out(), false), stats = g.tensor(STATS, f, l.t1(), l.bht1(), false);
  auto dq = g.tensor(DQ, io, l.td(), l.qkv(), false), dk = g.tensor(DK, io, l.td(), l.qkv(), false);
  auto dv = g.tensor(DV, io, l.td(), l.qkv(), false);
  auto scale = g.scalar(SCALE), neg = g.scalar(NEG_INF), keep = g.scalar(KEEP);
  const bool dropout = s.dropout > 0;
  // Row sums of dO * O (the softmax backward's), times 1 - p with dropout (see dS below), written
  // to the workspace.
  auto prod = g.virt(f, l.td(), {l.NH * l.T * l.HS, l.T * l.HS, l.NH * l.HS, 1}), dsum = g.virt(f, l.t1(), l.bht1());
  auto rowsum = g.tensor(ROW_SUM, f, l.t1(), l.bht1(), false);
  g.pointwise(CUDNN_POINTWISE_MUL, dout, prod, o);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, prod, dsum);
  g.pointwise(CUDNN_POINTWISE_MUL, dsum, rowsum, keep);
  // P again from the scores and the forward's row statistic.
  auto s0 = g.virt(f, l.tt(), l.bhtt()), s1 = g.virt(f, l.tt(), l.bhtt()), s2 = g.virt(f, l.tt(), l.bhtt());
  g.matmul(q, kt, s0);
  g.pointwise(CUDNN_POINTWISE_MUL, s0, s1, scale);
  g.pointwise(CUDNN_POINTWISE_SUB, s1, s2, stats);
  auto s3 = causal(g, l, s, s2, neg);
  auto p = g.virt(f, l.tt(), l.bhtt());
  g.pointwise(CUDNN_POINTWISE_EXP, s3, p);
  // With dropout the values saw Pd = P * mask / (1 - p): dV = Pd^T dO, and dP (of P) = dPd * mask /
  // (1 - p), so dS = P (dPd * mask - rowsum (1 - p)) / (1 - p) with rowsum = rowsum(dO * O).
  cudnnBackendDescriptor_t mask = nullptr, dscale = nullptr, pd = p;
  if (dropout) {
    mask = dropout_mask(g, l, s);
    dscale = g.scalar(DROP_SCALE);
    auto pm = g.virt(f, l.tt(), l.bhtt());
    pd = g.virt(f, l.tt(), l.bhtt());
    g.pointwise(CUDNN_POINTWISE_MUL, p, pm, mask);
    g.pointwise(CUDNN_POINTWISE_MUL, pm, pd, dscale);
  }
  auto pt = g.virt(io, l.tt(), l.bhtt_t());
  g.reshape(pd, pt);
  g.matmul(pt, dout, dv);  // dV = Pd^T dO
  auto dp = g.virt(f, l.tt(), l.bhtt()), dp1 = g.virt(f, l.tt(), l.bhtt());
  auto ds = g.virt(f, l.tt(), l.bhtt()), ds1 = g.virt(f, l.tt(), l.bhtt());
  g.matmul(dout, vt, dp);  // dPd = dO V^T
  if (dropout) {
    auto dpm = g.virt(f, l.tt(), l.bhtt());
    g.pointwise(CUDNN_POINTWISE_MUL, dp, dpm, mask);
    dp = dpm;
  }
  g.pointwise(CUDNN_POINTWISE_SUB, dp, dp1, rowsum);
  g.pointwise(CUDNN_POINTWISE_MUL, dp1, ds, p);
  if (dropout) {
    auto dsd = g.virt(f, l.tt(), l.bhtt());
    g.pointwise(CUDNN_POINTWISE_MUL, ds, dsd, dscale);
    ds = dsd;
  }
  g.pointwise(CUDNN_POINTWISE_MUL, ds, ds1, scale);
  auto dst = g.virt(io, l.tt(), l.bhtt_t());
  g.reshape(ds1, dst);
  g.matmul(dst, q, dk);  // dK = dS^T Q
  auto kn = g.virt(io, l.td(), l.qkv());
  g.reshape(kt, kn);
  auto acc = g.tensor(DQ_ACC, f, l.td(), l.bhtd(), false);
  g.matmul(ds1, kn, acc);  // dQ = dS K, accumulated in fp32
  g.pointwise(CUDNN_POINTWISE_IDENTITY, acc, dq);
}

size_t round_up(size_t n) { return (n + 255) / 256 * 256; }
size_t row_sum_bytes(const FusedShape& s) { return round_up((size_t)s.B * s.NH * s.T * sizeof(float)); }
size_t dq_acc_bytes(const FusedShape& s) { return round_up((size_t)s.B * s.NH * s.T * s.HS * sizeof(float)); }

// base + elements x bytes_each, as a mutable pointer (a variant pack's data pointer).
void* at(const void* base, size_t elements, size_t bytes_each) {
  return const_cast<char*>(static_cast<const char*>(base)) + elements * bytes_each;
}

}  // namespace

struct CudnnAttention::Plans {
  cudnn::Plan forward, backward;
};

std::string CudnnAttention::check_offline(const FusedShape& s, const std::string& device_json) {
  std::string why;
  auto lib = cudnn::load(&why);
  if (!lib) return why;
  try {
    Desc device(*lib, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "the device's properties");
    device.set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, (int64_t)device_json.size(), device_json.data())
        .finalize();
    Plans p;
    Graph fwd(*lib), bwd(*lib);
    forward_graph(fwd, s);
    build(*lib, nullptr, device.get(), fwd, p.forward, "forward");
    backward_graph(bwd, s);
    build(*lib, nullptr, device.get(), bwd, p.backward, "backward");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::unique_ptr<CudnnAttention> CudnnAttention::open(cudaStream_t stream, std::string* why) {
  auto lib = cudnn::load(why);
  if (!lib) return nullptr;
  std::unique_ptr<CudnnAttention> a(new CudnnAttention());
  a->lib_ = std::move(lib);
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t st = a->lib_->create(&h);
  if (st != CUDNN_STATUS_SUCCESS) {
    if (why) *why = std::string("cudnnCreate failed: ") + a->lib_->error_string(st);
    return nullptr;
  }
  a->handle_ = h;
  a->stream_ = stream;
  if (a->lib_->set_stream(h, stream) != CUDNN_STATUS_SUCCESS) {
    if (why) *why = "cudnnSetStream failed";
    return nullptr;  // the destructor destroys the handle
  }
  return a;
}

CudnnAttention::~CudnnAttention() {
  plans_.clear();  // the plans' descriptors before the handle
  if (handle_) lib_->destroy(static_cast<cudnnHandle_t>(handle_));
}

std::string CudnnAttention::version() const {
  const size_t v = lib_->get_version();
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

bool CudnnAttention::prepare(const FusedShape& s, std::string* why) {
  if (plans_.count(s)) return true;
  if (auto r = refused_.find(s); r != refused_.end()) {
    if (why) *why = r->second;
    return false;
  }
  // cudnn-frontend's support surface: 9.10.0 and 9.10.1 have known SDPA bugs; up to 9.15.0 the
  // backward needs a padding mask where T is not a multiple of 128 (an invalid access otherwise).
  const size_t v = lib_->get_version();
  std::string old;
  if (v == 91000 || v == 91001) old = "cuDNN " + version() + " has known attention bugs (9.10.2 or newer)";
  else if (v <= 91500 && s.T % 128 != 0)
    old = "cuDNN " + version() + " needs a sequence length that is a multiple of 128 (T=" + std::to_string(s.T) +
          "; 9.15.1 or newer takes any)";
  if (!old.empty()) {
    refused_[s] = old;
    if (why) *why = old;
    return false;
  }
  auto p = std::make_unique<Plans>();
  try {
    cudnnHandle_t h = static_cast<cudnnHandle_t>(handle_);
    Graph fwd(*lib_), bwd(*lib_);
    forward_graph(fwd, s);
    build(*lib_, h, nullptr, fwd, p->forward, "forward");
    backward_graph(bwd, s);
    build(*lib_, h, nullptr, bwd, p->backward, "backward");
  } catch (const Error& e) {
    refused_[s] = e.what();
    if (why) *why = e.what();
    return false;
  }
  plans_[s] = std::move(p);
  return true;
}

const CudnnAttention::Plans& CudnnAttention::plans(const FusedShape& s) const {
  auto it = plans_.find(s);
  if (it == plans_.end())
    throw Error("cuDNN attention: no plan for B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                " heads=" + std::to_string(s.NH) + " x " + std::to_string(s.HS) + " (prepare() first)");
  return *it->second;
}

size_t CudnnAttention::forward_workspace(const FusedShape& s) const {
  return round_up((size_t)plans(s).forward.workspace);
}
size_t CudnnAttention::backward_workspace(const FusedShape& s) const {
  return dq_acc_bytes(s) + row_sum_bytes(s) + round_up((size_t)plans(s).backward.workspace);
}

void CudnnAttention::forward(const FusedShape& s, const void* qkv, void* o, float* stats, void* workspace,
                             int64_t seed, const int32_t* key_start) {
  const size_t C = (size_t)s.NH * s.HS;
  float scale = 1.0f / std::sqrt((float)s.HS), neg = -std::numeric_limits<float>::infinity();
  float drop_scale = 1.0f / (1.0f - s.dropout);
  int64_t offset = 0;
  if (lib_->get_version() < 91000) neg = std::numeric_limits<float>::lowest();  // as cudnn-frontend does
  std::vector<int64_t> uids = {Q, K, V, O, STATS, SCALE, NEG_INF};
  std::vector<void*> ptrs = {at(qkv, 0, 2), at(qkv, C, 2), at(qkv, 2 * C, 2), o, stats, &scale, &neg};
  if (s.dropout > 0) {
    uids.insert(uids.end(), {SEED, OFFSET, DROP_SCALE});
    ptrs.insert(ptrs.end(), {&seed, &offset, &drop_scale});
  }
  if (s.documents) uids.push_back(KEY_START), ptrs.push_back(const_cast<int32_t*>(key_start));
  execute(*lib_, static_cast<cudnnHandle_t>(handle_), plans(s).forward, uids, ptrs, workspace, "forward");
}

void CudnnAttention::backward(const FusedShape& s, const void* qkv, const void* o, const void* dout, const float* stats,
                              void* dqkv, void* workspace, int64_t seed, const int32_t* key_start) {
  const size_t C = (size_t)s.NH * s.HS;
  float scale = 1.0f / std::sqrt((float)s.HS), neg = -std::numeric_limits<float>::infinity();
  float keep = 1.0f - s.dropout, drop_scale = 1.0f / (1.0f - s.dropout);
  int64_t offset = 0;
  if (lib_->get_version() < 91000) neg = std::numeric_limits<float>::lowest();
  void* acc = workspace;
  void* rowsum = at(workspace, dq_acc_bytes(s), 1);
  void* rest = at(rowsum, row_sum_bytes(s), 1);
  // Before cuDNN 9.6 the dq accumulator had to start at zero (cudnn-frontend clears it).
  if (lib_->get_version() < 90600) {
    const cudaError_t err = cudaMemsetAsync(acc, 0, dq_acc_bytes(s), stream_);
    if (err != cudaSuccess) throw Error(std::string("cuDNN attention: clearing the dq accumulator: ") + cudaGetErrorString(err));
  }
  std::vector<int64_t> uids = {Q, K, V, O, DO, STATS, DQ, DK, DV, SCALE, NEG_INF, KEEP, ROW_SUM, DQ_ACC};
  std::vector<void*> ptrs = {at(qkv, 0, 2),         at(qkv, C, 2),    at(qkv, 2 * C, 2),
                             const_cast<void*>(o),   const_cast<void*>(dout), const_cast<float*>(stats),
                             at(dqkv, 0, 2),         at(dqkv, C, 2),   at(dqkv, 2 * C, 2),
                             &scale,                 &neg,             &keep,
                             rowsum,                 acc};
  if (s.dropout > 0) {
    uids.insert(uids.end(), {SEED, OFFSET, DROP_SCALE});
    ptrs.insert(ptrs.end(), {&seed, &offset, &drop_scale});
  }
  if (s.documents) uids.push_back(KEY_START), ptrs.push_back(const_cast<int32_t*>(key_start));
  execute(*lib_, static_cast<cudnnHandle_t>(handle_), plans(s).backward, uids, ptrs, rest, "backward");
}

std::string fused_attention_offline(int B, int T, int NH, int HS, bool fp16, float dropout, bool documents,
                                    const std::string& device_json) {
  return CudnnAttention::check_offline({B, T, NH, HS, fp16, dropout, documents}, device_json);
}

}  // namespace hpct::kernels::cuda
