// cuDNN's fused causal attention through the graph API (cudnn_attention.hpp).
//
// The graphs are the composite ones cudnn-frontend builds for cuDNN 9 before its native SDPA node
// takes causal masks (9.21): forward S = scale Q K^T, the causal mask as GEN_INDEX row >= col and a
// BINARY_SELECT of -inf, the softmax as max / sub / exp / sum reductions with the row statistic
// max + log(sum) written out, O = P V; backward the row sums of dO * O, P recomputed from the
// statistic, dV = P^T dO, dS = P (dO V^T - rowsum) scale, dK = dS^T Q, dQ = dS K through an fp32
// accumulator. K and V enter transposed (their strides swapped), as the backend expects.
#include "cudnn_attention.hpp"

#include <cudnn_graph.h>  // types and enums; the functions are looked up in the library (dlopen)
#include <dlfcn.h>

#include <array>
#include <cmath>
#include <type_traits>
#include <limits>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/cuda_ops.hpp"

namespace hpct::kernels::cuda {

struct CudnnAttention::Library {
  void* so = nullptr;
  decltype(&cudnnGetVersion) get_version = nullptr;
  decltype(&cudnnGetErrorString) error_string = nullptr;
  decltype(&cudnnGetLastErrorString) last_error = nullptr;
  decltype(&cudnnCreate) create = nullptr;
  decltype(&cudnnDestroy) destroy = nullptr;
  decltype(&cudnnSetStream) set_stream = nullptr;
  decltype(&cudnnBackendCreateDescriptor) create_desc = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) destroy_desc = nullptr;
  decltype(&cudnnBackendSetAttribute) set_attr = nullptr;
  decltype(&cudnnBackendGetAttribute) get_attr = nullptr;
  decltype(&cudnnBackendFinalize) finalize = nullptr;
  decltype(&cudnnBackendExecute) execute = nullptr;
  ~Library() {
    if (so) dlclose(so);
  }

  void check(cudnnStatus_t st, const std::string& what) const {
    if (st == CUDNN_STATUS_SUCCESS) return;
    char detail[512] = {0};
    if (last_error) last_error(detail, sizeof detail);
    throw Error("cuDNN: " + what + ": " + error_string(st) + (detail[0] ? std::string(": ") + detail : std::string()));
  }
};

namespace {

using Dims = std::array<int64_t, 4>;

// One backend descriptor, destroyed with it.
class Desc {
 public:
  Desc(const CudnnAttention::Library& L, cudnnBackendDescriptorType_t type, const char* what) : L_(&L), what_(what) {
    L.check(L.create_desc(type, &d_), std::string("creating ") + what);
  }
  ~Desc() {
    if (d_) L_->destroy_desc(d_);
  }
  Desc(Desc&& o) noexcept : L_(o.L_), d_(o.d_), what_(o.what_) { o.d_ = nullptr; }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc& operator=(Desc&&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  Desc& set(cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const void* v) {
    L_->check(L_->set_attr(d_, a, t, n, v), std::string("setting attribute ") + std::to_string((int)a) + " of " + what_);
    return *this;
  }
  Desc& set(cudnnBackendAttributeName_t a, cudnnBackendDescriptor_t v) {
    return set(a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
  }
  Desc& set(cudnnBackendAttributeName_t a, cudnnDataType_t v) { return set(a, CUDNN_TYPE_DATA_TYPE, 1, &v); }
  Desc& set_i64(cudnnBackendAttributeName_t a, int64_t v) { return set(a, CUDNN_TYPE_INT64, 1, &v); }
  Desc& finalize() {
    L_->check(L_->finalize(d_), std::string("finalizing ") + what_);
    return *this;
  }

 private:
  const CudnnAttention::Library* L_;
  cudnnBackendDescriptor_t d_ = nullptr;
  const char* what_;
};

// Builds one operation graph: its tensors and operations, kept alive with the plan.
class Graph {
 public:
  explicit Graph(const CudnnAttention::Library& L) : L_(&L) {}

  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
                                  bool is_virtual, bool by_value = false) {
    Desc t(*L_, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "a tensor");
    const int64_t align = 16;
    const bool v = is_virtual, bv = by_value;
    t.set_i64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
        .set(CUDNN_ATTR_TENSOR_DATA_TYPE, type)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data())
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data())
        .set_i64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, align)
        .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
    if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv);
    t.finalize();
    return keep_desc(std::move(t));
  }
  // An intermediate tensor (never in memory).
  cudnnBackendDescriptor_t virt(cudnnDataType_t type, const Dims& dims, const Dims& strides) {
    return tensor(next_virtual_++, type, dims, strides, true);
  }
  // A scalar passed by value (a host float, or int64, in the variant pack).
  cudnnBackendDescriptor_t scalar(int64_t uid, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return tensor(uid, type, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }
  // y: a Bernoulli mask keeping each element with probability `keep`, from Philox(seed, offset).
  void rng(double keep, cudnnBackendDescriptor_t seed, cudnnBackendDescriptor_t offset, cudnnBackendDescriptor_t y) {
    Desc r(*L_, CUDNN_BACKEND_RNG_DESCRIPTOR, "a random generator");
    const cudnnRngDistribution_t bernoulli = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
    r.set(CUDNN_ATTR_RNG_DISTRIBUTION, CUDNN_TYPE_RNG_DISTRIBUTION, 1, &bernoulli)
        .set(CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, CUDNN_TYPE_DOUBLE, 1, &keep)
        .finalize();
    Desc op(*L_, CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR, "a random generator operation");
    op.set(CUDNN_ATTR_OPERATION_RNG_YDESC, y)
        .set(CUDNN_ATTR_OPERATION_RNG_DESC, r.get())
        .set(CUDNN_ATTR_OPERATION_RNG_SEED, seed)
        .set(CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, offset)
        .finalize();
    keep_desc(std::move(r));
    ops_.push_back(keep_desc(std::move(op)));
  }

  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    Desc m(*L_, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "a matmul");
    m.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT).finalize();
    Desc op(*L_, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "a matmul operation");
    op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .set(CUDNN_ATTR_OPERATION_MATMUL_DESC, m.get())
        .finalize();
    keep_desc(std::move(m));
    ops_.push_back(keep_desc(std::move(op)));
  }
  // y = mode(x[, b[, t]]); math precision `prec`; GEN_INDEX along `axis`.
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                 cudnnBackendDescriptor_t b = nullptr, cudnnBackendDescriptor_t t = nullptr,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Desc pw(*L_, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "a pointwise");
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode).set(CUDNN_ATTR_POINTWISE_MATH_PREC, prec);
    if (axis >= 0) pw.set_i64(CUDNN_ATTR_POINTWISE_AXIS, axis);
    pw.finalize();
    Desc op(*L_, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "a pointwise operation");
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get()).set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y).finalize();
    keep_desc(std::move(pw));
    ops_.push_back(keep_desc(std::move(op)));
  }
  // y = x reduced over the dimensions where y is 1.
  void reduce(cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Desc r(*L_, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "a reduction");
    r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how)
        .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT)
        .finalize();
    Desc op(*L_, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "a reduction operation");
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r.get())
        .finalize();
    keep_desc(std::move(r));
    ops_.push_back(keep_desc(std::move(op)));
  }
  // y: x's elements under other dimensions and strides (a transposed view).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Desc op(*L_, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "a reshape operation");
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x).set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y).finalize();
    ops_.push_back(keep_desc(std::move(op)));
  }

  const std::vector<cudnnBackendDescriptor_t>& ops() const { return ops_; }
  std::vector<Desc> release() { return std::move(keep_); }

 private:
  cudnnBackendDescriptor_t keep_desc(Desc&& d) {
    keep_.push_back(std::move(d));
    return keep_.back().get();
  }
  const CudnnAttention::Library* L_;
  std::vector<Desc> keep_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = 1000;
};

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

}  // namespace

struct CudnnAttention::Plan {
  std::vector<Desc> graph_parts;
  std::unique_ptr<Desc> graph, plan;
  int64_t workspace = 0;
  bool linked = true;  // false: built ahead of time up to the driver's link (check_offline)
};

struct CudnnAttention::Plans {
  Plan forward, backward;
};

namespace {

// The operation graph and the first engine configuration of cuDNN's heuristics (mode A) that
// finalizes into an execution plan: for the handle's GPU, or without one (h null) for the device
// `device` describes (a DEVICEPROP descriptor: cuDNN compiles for it ahead of time).
void build(const CudnnAttention::Library& L, cudnnHandle_t h, cudnnBackendDescriptor_t device, Graph& g,
           CudnnAttention::Plan& out, const char* which) {
  out.graph = std::make_unique<Desc>(L, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "the operation graph");
  if (h) out.graph->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  out.graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)g.ops().size(), g.ops().data())
      .finalize();
  Desc heur(L, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "the heuristics");
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, out.graph->get()).set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (!h) heur.set(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, device);
  heur.finalize();
  int64_t count = 0;
  L.check(L.get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
          std::string("counting the heuristics' engines for the ") + which);
  if (count <= 0) throw Error(std::string("cuDNN: no engine for the ") + which + " graph on this device");
  std::vector<Desc> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    cfgs.emplace_back(L, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "an engine configuration");
    raw.push_back(cfgs.back().get());
  }
  int64_t got = 0;
  L.check(L.get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()),
          std::string("reading the heuristics' engines for the ") + which);
  if (got <= 0) throw Error(std::string("cuDNN: no engine for the ") + which + " graph on this device");
  std::string last;
  for (int64_t i = 0; i < got; ++i) {
    auto plan = std::make_unique<Desc>(L, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "an execution plan");
    if (h) plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    else plan->set(CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, device);
    plan->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[i]);
    const cudnnStatus_t st = L.finalize(plan->get());
    if (st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER && !h) {
      // Ahead of time without a GPU: the engine passed its support checks and cuDNN generated and
      // compiled its kernel (NVRTC); only loading it needs a GPU's driver (there is a stub).
      out.linked = false;
      out.graph_parts = g.release();
      return;
    }
    if (st != CUDNN_STATUS_SUCCESS) {
      try {
        L.check(st, std::string("finalizing the ") + which + " execution plan");
      } catch (const Error& e) {
        last = e.what();
      }
      continue;
    }
    int64_t n = 0;
    L.check(L.get_attr(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &out.workspace),
            "reading a plan's workspace size");
    out.plan = std::move(plan);
    out.graph_parts = g.release();
    return;
  }
  throw Error(std::string("cuDNN: none of the ") + std::to_string(got) + " engines for the " + which +
              " graph builds a plan" + (last.empty() ? "" : " (" + last + ")"));
}

void execute(const CudnnAttention::Library& L, cudnnHandle_t h, const CudnnAttention::Plan& p,
             const std::vector<int64_t>& uids, const std::vector<void*>& ptrs, void* workspace, const char* which) {
  Desc pack(L, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "a variant pack");
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)ptrs.size(), ptrs.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace)
      .finalize();
  L.check(L.execute(h, p.plan->get(), pack.get()), std::string("running the fused attention ") + which);
}

void* at(const void* base, size_t elements, size_t bytes_each) {
  return const_cast<char*>(static_cast<const char*>(base)) + elements * bytes_each;
}

}  // namespace

namespace {
// libcudnn.so.9 and its graph API's functions; nullptr with the reason where it cannot be had.
std::unique_ptr<CudnnAttention::Library> load(std::string* why) {
  auto lib = std::make_unique<CudnnAttention::Library>();
  lib->so = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  if (!lib->so) {
    if (why) *why = std::string("libcudnn.so.9 not found (") + dlerror() + ")";
    return nullptr;
  }
  bool ok = true;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib->so, name));
    if (!fn) ok = false;
  };
  sym(lib->get_version, "cudnnGetVersion");
  sym(lib->error_string, "cudnnGetErrorString");
  sym(lib->create, "cudnnCreate");
  sym(lib->destroy, "cudnnDestroy");
  sym(lib->set_stream, "cudnnSetStream");
  sym(lib->create_desc, "cudnnBackendCreateDescriptor");
  sym(lib->destroy_desc, "cudnnBackendDestroyDescriptor");
  sym(lib->set_attr, "cudnnBackendSetAttribute");
  sym(lib->get_attr, "cudnnBackendGetAttribute");
  sym(lib->finalize, "cudnnBackendFinalize");
  sym(lib->execute, "cudnnBackendExecute");
  if (!ok) {
    if (why) *why = "libcudnn.so.9 lacks the graph API's functions";
    return nullptr;
  }
  lib->last_error = reinterpret_cast<decltype(lib->last_error)>(dlsym(lib->so, "cudnnGetLastErrorString"));
  return lib;
}
}  // namespace

std::string CudnnAttention::check_offline(const FusedShape& s, const std::string& device_json) {
  std::string why;
  auto lib = load(&why);
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
  auto lib = load(why);
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
