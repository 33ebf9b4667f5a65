// hpct/model/tensor_parallel.hpp — Megatron's tensor-parallel pieces for the model's layers.
//
// A layer split over T ranks (the tensor-parallel group) follows Megatron-LM: a column-parallel
// linear holds out/T rows of the weight (each rank computes its columns of Y; QKV by heads, fc by
// 4h columns), a row-parallel linear holds in/T columns (each rank a partial Y, summed over the
// group; the bias, replicated, is added once). The conjugate operators are:
//   f (before a column-parallel linear): identity forward, all-reduce of dX backward;
//   g (after a row-parallel linear):     all-reduce forward, identity backward.
// The linears themselves are the backend's matmuls on the parts; what is new lives here: the
// all-reduces (with their bytes counted), the vocab-parallel embedding (each rank a slice of the
// vocabulary, out-of-slice ids give zero rows, then g) and the vocab-parallel cross entropy (max,
// target logit and sum of exponentials all-reduced; no rank ever holds a full row of logits).
// Sequence parallelism (Megatron's --sequence-parallel, Korthikanti et al. 2022): the residual stream,
// the norms and the residual adds hold 1/T of the N token rows on each rank (rank r rows
// [r*N/T, (r+1)*N/T)); f becomes an all-gather of those rows (backward: reduce-scatter) and g a
// reduce-scatter (backward: all-gather). Same arithmetic, same wire bytes as the all-reduces.
// Any backend: the element work runs as the backend's ops (kernels/tp_ops.hpp) on its memory. On a
// device backend the collectives run on the device buffers when the caller gives device collectives
// over the group (set_device_comm: NCCL, which needs one GPU per rank), and otherwise
// through host buffers (copied out, MPI, copied back in), as the data-parallel gradients of a device
// run do (ZeRO-Offload), so ranks that share one GPU work too. The MoE layer's all-gather and
// reduce-scatter of duplicate token dropping take host buffers on any backend (the layer stages its
// rows around them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "hpct/comm/gpu.hpp"
#include "hpct/comm/mpi.hpp"
#include "hpct/kernels/ops_backend.hpp"

namespace hpct::model {

class TensorParallel {
 public:
  /// tp: the tensor-parallel group; nullptr (or size 1) = no tensor parallelism.
  explicit TensorParallel(const comm::Communicator* tp = nullptr);
  /// The backend whose memory the pointers below are in and whose ops do the element work (the
  /// model's). Until it is set: a CPU backend of its own (host memory).
  void set_backend(kernels::OpsBackend* ops) { release_buffers(), ops_ = ops ? ops : own_ops_.get(); }
  /// Collectives over the same group on the backend's device (comm/gpu.hpp: NCCL in a run; it must
  /// outlive this): on a device backend every collective but the MoE layer's gather and scatter then
  /// runs on device buffers, none through the host. Each must finish within timeout_s, or the run
  /// stops with an hpct::Error naming the collective and the reason. nullptr: through host buffers.
  void set_device_comm(comm::DeviceCollectives* dc, double timeout_s = 600) { dc_ = dc, dc_timeout_s_ = timeout_s; }
  /// True when the collectives run on device buffers (set_device_comm on a device backend).
  bool device_collectives() const { return dc_ && comm_ && !ops_->host_memory(); }
  /// Gives the backend's buffers back (the model's destructor calls it while its backend lives).
  void release_buffers() { ce_max_.reset(), ce_sums_.reset(); }
  int size() const { return size_; }
  int rank() const { return rank_; }
  bool enabled() const { return size_ > 1; }
  /// Sequence parallelism on (a no-op at size 1, as in Megatron).
  void set_sequence_parallel(bool on) { sp_ = on; }
  bool sequence_parallel() const { return sp_ && size_ > 1; }
  /// This rank's token rows of N under sequence parallelism: [first, first + count); all N without.
  size_t local_rows(size_t N) const { return sequence_parallel() ? N / size_ : N; }
  size_t first_row(size_t N) const { return sequence_parallel() ? rank_ * (N / size_) : 0; }

  /// g forward / f backward: in-place sum of n floats over the group (nothing at size 1).
  void all_reduce(float* x, size_t n);
  /// Payload bytes all-reduced since construction (each call counts its buffer once, the quantity
  /// Megatron's 4 x B*s*h per layer counts; a ring moves 2(T-1)/T of it per rank on the wire).
  double bytes() const { return bytes_; }
  /// Of those, the activations' all-reduces (g and f), apart from the cross entropy's row scalars.
  double activation_bytes() const { return act_bytes_; }
  int calls() const { return calls_; }
  /// Bytes a ring moves per rank for the activations' collectives: 2(T-1)/T of an all-reduce's
  /// buffer, (T-1)/T of an all-gather's or reduce-scatter's full buffer (so sequence parallelism's
  /// all-gather + reduce-scatter pairs move what the all-reduces they replace move).
  double activation_wire_bytes() const { return wire_bytes_; }

  /// Sequence parallelism's f forward / g backward: full (n floats, all N rows) holds this rank's
  /// slice at its place; the other ranks' slices are gathered in (nothing without sequence parallelism).
  void all_gather(float* full, size_t n);
  /// Sequence parallelism's g forward / f backward: slice (n/T floats) = this rank's rows of the sum
  /// of every rank's full (n floats). Without sequence parallelism: all_reduce(full) in place, and
  /// slice must be full.
  void reduce_scatter(float* full, float* slice, size_t n);
  // The MoE layer's collectives over the group (duplicate token dropping, tensor-parallel experts).
  // Not counted here: the MoE layer counts its own bytes. The all-gather and the reduce-scatter take
  // host memory on every backend; the all-reduce the backend's.
  /// data holds every rank's rows (rows[r] rows of width floats from rank r, in rank order) with
  /// this rank's in place; the others' are gathered in.
  void moe_all_gather(float* data, const std::vector<int>& rows, int width);
  /// send: rows for every rank in rank order; mine (rows[rank()] rows) = their sum over the group.
  void moe_reduce_scatter(const float* send, float* mine, const std::vector<int>& rows, int width);
  /// In-place sum of n floats over the group.
  void moe_all_reduce(float* x, size_t n);
  /// Replicated tensors' gradients from split rows (norms under sequence parallelism): in-place sum
  /// of g (n floats, this micro-batch's partial sums only) over the group; not an activation's bytes.
  void reduce_partial_grads(float* g, size_t n);
  /// LoRA's low-rank products (rows x rank, model/lora.cpp): in-place sum of n floats over the group;
  /// counted in bytes(), not in the activations' (Megatron's formula has no adapters).
  void adapter_all_reduce(float* x, size_t n);
  /// Vocab-parallel embedding with learned positions: out (B*T, C) = wte[token] + wpe[t], where this
  /// rank holds rows [vstart, vstart + vrows) of wte (wte_part) and every rank the whole wpe. Under
  /// sequence parallelism out gets this rank's rows only, and scratch (B*T, C) takes the parts.
  /// pos: each token's position (documents in a sample, ops.hpp's encoder_forward), nullptr: t.
  void embedding_forward(float* out, const int32_t* tokens, const float* wte_part, const float* wpe, int B, int T,
                         int C, int vstart, int vrows, float* scratch, const int32_t* pos = nullptr);
  /// Accumulates d(wte_part) (this rank's rows only; nullptr: a frozen embedding) and d(wpe) (every
  /// rank alike) from dout (B*T, C).
  void embedding_backward(float* dwte_part, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                          int vstart, int vrows, const int32_t* pos = nullptr);
  /// Vocab-parallel cross entropy over logits (rows, vl): this rank's columns [vstart, vstart + vl)
  /// of the padded vocabulary; columns >= V are padding and never take part. losses (rows) get
  /// -log softmax(target) (0 where target < 0), the same on every rank. With backward the logits
  /// are replaced by dloss * (softmax - onehot(target)) on this rank's columns (0 on padding and
  /// ignored rows), as the backend's softmax_cross_entropy does for a whole row.
  void cross_entropy(float* logits, float* losses, const int32_t* targets, float dloss, int rows, int vl, int vstart,
                     int V, bool backward);

 private:
  const comm::Communicator* comm_ = nullptr;
  int size_ = 1, rank_ = 0;
  bool sp_ = false;
  double bytes_ = 0, act_bytes_ = 0, wire_bytes_ = 0;
  void count(double payload, double wire_factor, bool activation);
  void sum_not_activation(float* x, size_t n);  // reduce_partial_grads and adapter_all_reduce
  /// f(host pointer to n elements) on x (backend memory): x itself on a host backend; on a device
  /// one a host copy of x, copied back afterwards when write_back.
  template <class T, class F>
  void on_host(T* x, size_t n, bool write_back, F&& f);
  /// In-place sum (or maximum) of n elements of x over the group on the device, after the backend's
  /// queued ops; false (nothing done) without device collectives.
  bool device_allreduce(void* x, size_t n, comm::DeviceCollectives::Elem e, bool max = false);
  /// collective(deadline, &why) on the device buffers after the backend's queued ops; throws an
  /// error naming `what` and this rank when it fails.
  template <class F>
  void on_device(const char* what, F&& collective);
  comm::DeviceCollectives* dc_ = nullptr;
  double dc_timeout_s_ = 600;
  std::unique_ptr<kernels::OpsBackend> own_ops_;
  kernels::OpsBackend* ops_ = nullptr;
  int calls_ = 0;
  std::vector<char> host_, host2_;          // staging buffers of a device backend
  kernels::BackendBuffer ce_max_, ce_sums_;  // the cross entropy's per-row maxima and sums
};

}  // namespace hpct::model
