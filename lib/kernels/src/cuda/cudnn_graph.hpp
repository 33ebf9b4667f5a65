// cuDNN's graph API, opened at run time (internal to lib/kernels, not installed): the library's
// functions, RAII descriptors, an operation-graph builder, and a graph's execution plan built and
// run. The attention (cudnn_attention.hpp) composes its graphs from these.
//
// What it is: the backend API's steps (tensor and operation descriptors -> operation graph ->
// heuristics, mode A -> the first engine configuration that finalizes into a plan -> a variant
// pack per call), with cuDNN's status and last error message in every failure's text.
// What it is not: cudnn-frontend; no graph inference (every tensor's dims and strides are given).
#pragma once
#include <cudnn_graph.h>  // types and enums; the functions are looked up in the library (dlopen)

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hpct::kernels::cuda::cudnn {

struct Library {
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
  ~Library();

  /// Throws hpct::Error "cuDNN: <what>: <status>: <cuDNN's last error message>" unless st is success.
  void check(cudnnStatus_t st, const std::string& what) const;
};

/// libcudnn.so.9 and its graph API's functions; nullptr with the reason in *why where it cannot be had.
std::unique_ptr<Library> load(std::string* why);

using Dims = std::array<int64_t, 4>;

// One backend descriptor, destroyed with it.
class Desc {
 public:
  Desc(const Library& L, cudnnBackendDescriptorType_t type, const char* what) : L_(&L), what_(what) {
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
  const Library* L_;
  cudnnBackendDescriptor_t d_ = nullptr;
  const char* what_;
};

// Builds one operation graph: its tensors and operations, kept alive with the plan.
class Graph {
 public:
  explicit Graph(const Library& L) : L_(&L) {}

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
  const Library* L_;
  std::vector<Desc> keep_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = 1000;
};

struct Plan {
  std::vector<Desc> graph_parts;
  // The heuristics and the engine configuration the plan was finalized from, kept as long as the
  // plan (as cudnn-frontend keeps them), in case the plan refers to them rather than copying.
  std::unique_ptr<Desc> graph, heuristics, config, plan;
  int64_t workspace = 0;
  bool linked = true;  // false: built ahead of time up to the driver's link (check_offline)
};

/// The operation graph of g and the first engine configuration of cuDNN's heuristics (mode A) that
/// finalizes into an execution plan: for the handle's GPU, or without one (h null) for the device
/// `device` describes (a DEVICEPROP descriptor: cuDNN compiles for it ahead of time, and stops at the
/// driver's link where there is no GPU: out.linked false). Throws with cuDNN's reason.
void build(const Library& L, cudnnHandle_t h, cudnnBackendDescriptor_t device, Graph& g, Plan& out, const char* which);
/// Runs plan p on the handle's stream: uids[i] at ptrs[i] (a by-value scalar: a host pointer).
void execute(const Library& L, cudnnHandle_t h, const Plan& p, const std::vector<int64_t>& uids,
             const std::vector<void*>& ptrs, void* workspace, const char* which);

}  // namespace hpct::kernels::cuda::cudnn
