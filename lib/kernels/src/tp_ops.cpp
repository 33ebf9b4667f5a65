// CPU implementations of tp_ops.hpp: plain loops over rows, the loops model/tensor_parallel.cpp
// ran on host memory before they moved behind the backend. cuda/tp_ops.cu has the device twins.
#include "hpct/kernels/tp_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace hpct::kernels {

void vocab_rows(float* out, const float* part, const int32_t* ids, size_t N, int width, int first, int count) {
  for (size_t i = 0; i < N; ++i) {
    const long long r = (long long)ids[i] - first;
    float* o = out + i * width;
    if (r >= 0 && r < count) std::memcpy(o, part + (size_t)r * width, width * sizeof(float));
    else std::memset(o, 0, width * sizeof(float));
  }
}

void vocab_rows_backward(float* dpart, const float* dout, const int32_t* ids, size_t N, int width, int first,
                         int count) {
  for (size_t i = 0; i < N; ++i) {
    const long long r = (long long)ids[i] - first;
    if (r < 0 || r >= count) continue;
    const float* d = dout + i * width;
    float* e = dpart + (size_t)r * width;
    for (int c = 0; c < width; ++c) e[c] += d[c];
  }
}

void add_position_rows(float* out, const float* wpe, const int32_t* pos, size_t first, size_t rows, int T, int C) {
  for (size_t k = 0; k < rows; ++k) {
    const size_t i = first + k;
    const float* p = wpe + (pos ? (size_t)pos[i] : i % T) * C;
    float* o = out + k * C;
    for (int c = 0; c < C; ++c) o[c] += p[c];
  }
}

void vocab_ce_max(float* mx, const float* logits, int rows, int vl, int valid) {
  for (int i = 0; i < rows; ++i) {
    const float* row = logits + (size_t)i * vl;
    float m = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < valid; ++j) m = std::max(m, row[j]);
    mx[i] = m;
  }
}

void vocab_ce_sums(double* sums, const float* logits, const float* mx, const int32_t* targets, int rows, int vl,
                   int vstart, int valid) {
  for (int i = 0; i < rows; ++i) {
    const float* row = logits + (size_t)i * vl;
    double s = 0;
    for (int j = 0; j < valid; ++j) s += std::exp(row[j] - mx[i]);
    sums[i] = s;
    const long long t = (long long)targets[i] - vstart;
    sums[rows + i] = targets[i] >= 0 && t >= 0 && t < valid ? (double)(row[t] - mx[i]) : 0.0;
  }
}

void vocab_ce_finish(float* logits, float* losses, const float* mx, const double* sums, const int32_t* targets,
                     float dloss, int rows, int vl, int vstart, int valid, bool backward) {
  for (int i = 0; i < rows; ++i) {
    float* row = logits + (size_t)i * vl;
    if (targets[i] < 0) {
      losses[i] = 0.0f;
      if (backward) std::fill(row, row + vl, 0.0f);
      continue;
    }
    const double sum = sums[i];
    losses[i] = (float)(std::log(sum) - sums[rows + i]);
    if (!backward) continue;
    const float m = mx[i], g = (float)(dloss / sum);
    for (int j = 0; j < valid; ++j) row[j] = std::exp(row[j] - m) * g;
    std::fill(row + valid, row + vl, 0.0f);
    const long long t = (long long)targets[i] - vstart;
    if (t >= 0 && t < valid) row[t] -= dloss;
  }
}

}  // namespace hpct::kernels
