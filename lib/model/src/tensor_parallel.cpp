// Megatron's tensor-parallel collectives and vocab-parallel layers. See tensor_parallel.hpp.
#include "hpct/model/tensor_parallel.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "hpct/comm/deadline.hpp"
#include "hpct/core/error.hpp"


namespace hpct::model {

TensorParallel::TensorParallel(const comm::Communicator* tp) : own_ops_(kernels::cpu_ops()), ops_(own_ops_.get()) {
  if (tp && tp->size() > 1) comm_ = tp, size_ = tp->size(), rank_ = tp->rank();
}

void TensorParallel::count(double payload, double wire_factor, bool activation) {
  bytes_ += payload;
  if (activation) act_bytes_ += payload, wire_bytes_ += payload * wire_factor * (size_ - 1) / size_;
  ++calls_;
}

template <class T, class F>
void TensorParallel::on_host(T* x, size_t n, bool write_back, F&& f) {
  if (ops_->host_memory()) return f(x);
  host_.resize(n * sizeof(T));
  T* h = reinterpret_cast<T*>(host_.data());
  ops_->copy_to_host(h, x, n * sizeof(T));
  f(h);
  if (write_back) ops_->copy_from_host(x, h, n * sizeof(T));
}

template <class F>
void TensorParallel::on_device(const char* what, F&& collective) {
  ops_->synchronize();  // the collective's stream (NCCL's) reads what the backend's stream wrote
  std::string why;
  if (!collective(comm::steady_seconds() + dc_timeout_s_, &why))
    throw Error(std::string("tensor-parallel ") + what + " on device buffers, tensor-parallel rank " +
                std::to_string(rank_) + " of " + std::to_string(size_) + ": " + why);
}

bool TensorParallel::device_allreduce(void* x, size_t n, comm::DeviceCollectives::Elem e, bool max) {
  if (!device_collectives()) return false;
  on_device(max ? "all-reduce (max)" : "all-reduce",
            [&](double deadline, std::string* why) { return dc_->allreduce(x, n, e, max, deadline, why); });
  return true;
}

void TensorParallel::all_reduce(float* x, size_t n) {
  if (!comm_) return;
  if (!device_allreduce(x, n, comm::DeviceCollectives::Elem::f32))
    on_host(x, n, true, [&](float* h) { comm_->allreduce_sum(h, n); });
  count(double(n) * sizeof(float), 2, true);
}

void TensorParallel::all_gather(float* full, size_t n) {
  if (!sequence_parallel()) return;
  const size_t block = n / size_;
  if (ops_->host_memory()) {
    comm_->allgather_blocks(full, block);
  } else if (device_collectives()) {
    on_device("all-gather",
              [&](double deadline, std::string* why) { return dc_->allgather_blocks(full, block, comm::DeviceCollectives::Elem::f32, deadline, why); });
  } else {  // only this rank's block goes out; every block comes back
    host_.resize(n * sizeof(float));
    float* h = reinterpret_cast<float*>(host_.data());
    ops_->copy_to_host(h + rank_ * block, full + rank_ * block, block * sizeof(float));
    comm_->allgather_blocks(h, block);
    ops_->copy_from_host(full, h, n * sizeof(float));
  }
  count(double(n) * sizeof(float), 1, true);
}

void TensorParallel::reduce_scatter(float* full, float* slice, size_t n) {
  if (!sequence_parallel()) return all_reduce(full, n);
  const size_t block = n / size_;
  if (ops_->host_memory()) {
    comm_->reduce_scatter_blocks(full, slice, block);
  } else if (device_collectives()) {
    on_device("reduce-scatter", [&](double deadline, std::string* why) {
      return dc_->reduce_scatter_blocks(full, slice, block, comm::DeviceCollectives::Elem::f32, deadline, why);
    });
  } else {
    host2_.resize(block * sizeof(float));
    float* hs = reinterpret_cast<float*>(host2_.data());
    on_host(full, n, false, [&](float* h) { comm_->reduce_scatter_blocks(h, hs, block); });
    ops_->copy_from_host(slice, hs, block * sizeof(float));
  }
  count(double(n) * sizeof(float), 1, true);
}

void TensorParallel::sum_not_activation(float* x, size_t n) {
  if (!comm_) return;
  if (!device_allreduce(x, n, comm::DeviceCollectives::Elem::f32))
    on_host(x, n, true, [&](float* h) { comm_->allreduce_sum(h, n); });
  count(double(n) * sizeof(float), 2, false);
}

void TensorParallel::reduce_partial_grads(float* g, size_t n) { sum_not_activation(g, n); }

void TensorParallel::adapter_all_reduce(float* x, size_t n) { sum_not_activation(x, n); }

void TensorParallel::moe_all_gather(float* data, const std::vector<int>& rows, int width) {
  if (comm_ && size_ > 1) comm_->allgatherv_rows(data, rows, width);
}

void TensorParallel::moe_reduce_scatter(const float* send, float* mine, const std::vector<int>& rows, int width) {
  if (comm_ && size_ > 1) comm_->reduce_scatterv_rows(send, mine, rows, width);
  else std::memmove(mine, send, (size_t)rows[0] * width * sizeof(float));
}

void TensorParallel::moe_all_reduce(float* x, size_t n) {
  if (comm_ && size_ > 1 && !device_allreduce(x, n, comm::DeviceCollectives::Elem::f32))
    on_host(x, n, true, [&](float* h) { comm_->allreduce_sum(h, n); });
}

void TensorParallel::embedding_forward(float* out, const int32_t* tokens, const float* wte_part, const float* wpe, int B,
                                       int T, int C, int vstart, int vrows, float* scratch, const int32_t* pos) {
  const size_t N = (size_t)B * T;
  float* parts = sequence_parallel() ? scratch : out;
  ops_->vocab_rows(parts, wte_part, tokens, N, C, vstart, vrows);  // out-of-slice tokens: zero rows
  // g: every token's row comes from the one rank that holds it (this rank's rows only under
  // sequence parallelism, written from row 0 of out).
  reduce_scatter(parts, out, N * C);
  if (wpe) ops_->add_position_rows(out, wpe, pos, first_row(N), local_rows(N), T, C);  // null: rotary positions
}

void TensorParallel::embedding_backward(float* dwte_part, float* dwpe, const float* dout, const int32_t* tokens, int B,
                                        int T, int C, int vstart, int vrows, const int32_t* pos) {
  // Each gradient element sums its tokens' rows in token order, as the backend's encoder_backward.
  if (dwpe) ops_->encoder_backward(nullptr, dwpe, dout, tokens, B, T, C, pos);
  if (dwte_part) ops_->vocab_rows_backward(dwte_part, dout, tokens, (size_t)B * T, C, vstart, vrows);
}

void TensorParallel::cross_entropy(float* logits, float* losses, const int32_t* targets, float dloss, int rows, int vl,
                                   int vstart, int V, bool backward) {
  // This rank's real (not padding) columns: [0, valid).
  const int valid = std::max(0, std::min(vl, V - vstart));
  if (ce_max_.bytes() < rows * sizeof(float)) {
    ce_max_ = kernels::BackendBuffer(*ops_, rows * sizeof(float));
    ce_sums_ = kernels::BackendBuffer(*ops_, 2 * rows * sizeof(double));
  }
  float* mx = ce_max_.as<float>();
  double* sums = ce_sums_.as<double>();
  ops_->vocab_ce_max(mx, logits, rows, vl, valid);
  if (comm_) {  // 1. the row maxima
    if (!device_allreduce(mx, rows, comm::DeviceCollectives::Elem::f32, true))
      on_host(mx, rows, true, [&](float* h) { comm_->allreduce_max(h, rows); });
    bytes_ += double(rows) * sizeof(float);
    ++calls_;
  }
  // 2. sum of exponentials and the (shifted) target logit, from the rank holding the target.
  ops_->vocab_ce_sums(sums, logits, mx, targets, rows, vl, vstart, valid);
  if (comm_) {
    if (!device_allreduce(sums, 2 * (size_t)rows, comm::DeviceCollectives::Elem::f64))
      on_host(sums, 2 * (size_t)rows, true, [&](double* h) { comm_->allreduce_sum(h, 2 * (size_t)rows); });
    bytes_ += 2.0 * rows * sizeof(double);
    ++calls_;
  }
  ops_->vocab_ce_finish(logits, losses, mx, sums, targets, dloss, rows, vl, vstart, valid, backward);
}

}  // namespace hpct::model
