// hpct/kernels/tp_ops.hpp — the per-row pieces of Megatron's vocab-parallel embedding and cross
// entropy, CPU backend.
//
// What it is: the element work of model/tensor_parallel.hpp's vocabulary-split layers, so that one
// model source runs them on any backend: the rows of a vocabulary slice (tokens outside it give
// zero rows), the learned positions added to a rank's token rows, and the three passes of a cross
// entropy over a slice of the logits' columns (row maxima, sums of exponentials and the target's
// logit, then the loss and the gradient). cuda_ops.hpp has the device twins; ops_backend.hpp puts
// both behind one interface. The all-reduces between the passes are the model's, not these.
// Row-major fp32; the cross entropy's sums in double, as the backend's whole-row cross entropy.
// Trade-off: every output element is written by one loop iteration in a fixed order (gradients
// accumulate in token order), so results do not depend on threading.
#pragma once
#include <cstddef>
#include <cstdint>

namespace hpct::kernels {

/// out row i = part[ids[i] - first] when first <= ids[i] < first + count, else zeros (N rows of width).
void vocab_rows(float* out /*(N,width)*/, const float* part /*(count,width)*/, const int32_t* ids /*(N)*/, size_t N,
                int width, int first, int count);
/// The backward: dpart[ids[i] - first] += dout row i for the ids in the slice, in token order.
void vocab_rows_backward(float* dpart /*(count,width)*/, const float* dout /*(N,width)*/, const int32_t* ids /*(N)*/,
                         size_t N, int width, int first, int count);
/// out row k += wpe[position of token row first + k] for k < rows: pos[first + k] when pos is given,
/// else (first + k) % T (samples of T tokens).
void add_position_rows(float* out /*(rows,C)*/, const float* wpe /*(P,C)*/, const int32_t* pos /*(?)*/, size_t first,
                       size_t rows, int T, int C);

/// A cross entropy over this rank's columns [vstart, vstart + vl) of the padded vocabulary, whose
/// real (not padding) columns are [0, valid) of each row of logits (rows, vl).
/// Pass 1: mx[i] = the maximum of row i's real columns (-inf when there are none).
void vocab_ce_max(float* mx /*(rows)*/, const float* logits /*(rows,vl)*/, int rows, int vl, int valid);
/// Pass 2 (mx summed to the group's maximum first): sums[i] = sum over real columns of
/// exp(logit - mx[i]); sums[rows + i] = the target's logit - mx[i] when this slice holds the target
/// (targets[i] - vstart in [0, valid)), else 0.
void vocab_ce_sums(double* sums /*(2*rows)*/, const float* logits, const float* mx, const int32_t* targets, int rows,
                   int vl, int vstart, int valid);
/// Pass 3 (sums summed over the group first): losses[i] = log(sums[i]) - sums[rows + i] (0 where
/// targets[i] < 0). With backward, the logits become dloss * (softmax - onehot(target)) on this
/// slice's real columns and 0 on padding and on ignored rows.
void vocab_ce_finish(float* logits /*(rows,vl)*/, float* losses /*(rows)*/, const float* mx, const double* sums,
                     const int32_t* targets, float dloss, int rows, int vl, int vstart, int valid, bool backward);

}  // namespace hpct::kernels
