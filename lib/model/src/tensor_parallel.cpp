// Megatron's tensor-parallel collectives and vocab-parallel layers. See tensor_parallel.hpp.
#include "hpct/model/tensor_parallel.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace hpct::model {

TensorParallel::TensorParallel(const comm::Communicator* tp) {
  if (tp && tp->size() > 1) comm_ = tp, size_ = tp->size(), rank_ = tp->rank();
}

void TensorParallel::count(double payload, double wire_factor, bool activation) {
  bytes_ += payload;
  if (activation) act_bytes_ += payload, wire_bytes_ += payload * wire_factor * (size_ - 1) / size_;
  ++calls_;
}

void TensorParallel::all_reduce(float* x, size_t n) {
  if (!comm_) return;
  comm_->allreduce_sum(x, n);
  count(double(n) * sizeof(float), 2, true);
}

void TensorParallel::all_gather(float* full, size_t n) {
  if (!sequence_parallel()) return;
  comm_->allgather_blocks(full, n / size_);
  count(double(n) * sizeof(float), 1, true);
}

void TensorParallel::reduce_scatter(float* full, float* slice, size_t n) {
  if (!sequence_parallel()) return all_reduce(full, n);
  comm_->reduce_scatter_blocks(full, slice, n / size_);
  count(double(n) * sizeof(float), 1, true);
}

void TensorParallel::sum_not_activation(float* x, size_t n) {
  if (!comm_) return;
  comm_->allreduce_sum(x, n);
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
  if (comm_ && size_ > 1) comm_->allreduce_sum(x, n);
}

void TensorParallel::embedding_forward(float* out, const int32_t* tokens, const float* wte_part, const float* wpe, int B,
                                       int T, int C, int vstart, int vrows, float* scratch, const int32_t* pos) {
  const size_t N = (size_t)B * T;
  float* parts = sequence_parallel() ? scratch : out;
  slice_rows(parts, wte_part, tokens, N, C, vstart, vrows);
  // g: every token's row comes from the one rank that holds it (this rank's rows only under
  // sequence parallelism, written from row 0 of out).
  reduce_scatter(parts, out, N * C);
  const size_t first = first_row(N), rows = local_rows(N);
  for (size_t k = 0; k < rows; ++k) {
    const size_t i = first + k;
    const float* p = wpe + (pos ? (size_t)pos[i] : i % T) * C;
    float* o = out + k * C;
    for (int c = 0; c < C; ++c) o[c] += p[c];
  }
}

void TensorParallel::slice_rows(float* out, const float* part, const int32_t* tokens, size_t N, int width, int vstart,
                                int vrows) {
  for (size_t i = 0; i < N; ++i) {
    const long long r = (long long)tokens[i] - vstart;
    float* o = out + i * width;
    if (r >= 0 && r < vrows) std::memcpy(o, part + (size_t)r * width, width * sizeof(float));
    else std::memset(o, 0, width * sizeof(float));
  }
}

void TensorParallel::embedding_backward(float* dwte_part, float* dwpe, const float* dout, const int32_t* tokens, int B,
                                        int T, int C, int vstart, int vrows, const int32_t* pos) {
  const size_t N = (size_t)B * T;
  for (size_t i = 0; i < N; ++i) {  // in token order, as the backend's encoder_backward
    const float* d = dout + i * C;
    float* p = dwpe + (pos ? (size_t)pos[i] : i % T) * C;
    for (int c = 0; c < C; ++c) p[c] += d[c];
    const long long r = (long long)tokens[i] - vstart;
    if (!dwte_part || r < 0 || r >= vrows) continue;
    float* e = dwte_part + (size_t)r * C;
    for (int c = 0; c < C; ++c) e[c] += d[c];
  }
}

void TensorParallel::cross_entropy(float* logits, float* losses, const int32_t* targets, float dloss, int rows, int vl,
                                   int vstart, int V, bool backward) {
  // This rank's real (not padding) columns: [0, valid).
  const int valid = std::max(0, std::min(vl, V - vstart));
  fbuf_.assign(rows, -std::numeric_limits<float>::infinity());
  for (int i = 0; i < rows; ++i) {
    const float* row = logits + (size_t)i * vl;
    float m = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < valid; ++j) m = std::max(m, row[j]);
    fbuf_[i] = m;
  }
  if (comm_) {  // 1. the row maxima
    comm_->allreduce_max(fbuf_.data(), rows);
    bytes_ += double(rows) * sizeof(float);
    ++calls_;
  }
  // 2. sum of exponentials and the (shifted) target logit, from the rank holding the target.
  dbuf_.assign((size_t)2 * rows, 0.0);
  for (int i = 0; i < rows; ++i) {
    const float* row = logits + (size_t)i * vl;
    const float mx = fbuf_[i];
    double s = 0;
    for (int j = 0; j < valid; ++j) s += std::exp(row[j] - mx);
    dbuf_[i] = s;
    const long long t = (long long)targets[i] - vstart;
    if (targets[i] >= 0 && t >= 0 && t < valid) dbuf_[rows + i] = (double)(row[t] - mx);
  }
  if (comm_) {
    comm_->allreduce_sum(dbuf_.data(), dbuf_.size());
    bytes_ += double(dbuf_.size()) * sizeof(double);
    ++calls_;
  }
  for (int i = 0; i < rows; ++i) {
    float* row = logits + (size_t)i * vl;
    if (targets[i] < 0) {
      losses[i] = 0.0f;
      if (backward) std::fill(row, row + vl, 0.0f);
      continue;
    }
    const double sum = dbuf_[i];
    losses[i] = (float)(std::log(sum) - dbuf_[rows + i]);
    if (!backward) continue;
    const float mx = fbuf_[i], g = (float)(dloss / sum);
    for (int j = 0; j < valid; ++j) row[j] = std::exp(row[j] - mx) * g;
    std::fill(row + valid, row + vl, 0.0f);
    const long long t = (long long)targets[i] - vstart;
    if (t >= 0 && t < valid) row[t] -= dloss;
  }
}

}  // namespace hpct::model
