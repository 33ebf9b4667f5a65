// The mixture-of-experts feed-forward of a transformer block (moe.hpp). See docs/moe.md.
//
// Forward, for the N rows x = ln2(h) of one micro-batch:
//   router   logits = x Wr^T (N, E), fp32 whatever the training precision (DeepSpeed's wg)
//   gate     moe_gate.hpp: top-k experts, capacity, dropping, combine weights, aux and z losses
//   dispatch each kept route's row is copied into a buffer sorted by (expert, slot): experts are
//            contiguous per owning rank, so one all-to-all over the expert-parallel group sends
//            every rank the rows of its experts (a gather, not a one-hot einsum: O(N k C) bytes)
//   experts  one MLP per local expert over its rows (one GEMM each, every source rank's rows together)
//   return   the second all-to-all brings the outputs back in the send order
//   combine  out[n] = sum_k weight[n,k] y[route(n,k)]; a dropped route adds nothing (the residual
//            stream carries the token); residual MoE mixes in the dense MLP with a learned softmax
//            coefficient (DeepSpeed's Residual-MoE).
// Backward runs the same steps in reverse (two more all-to-alls). The rows live in the backend's
// memory and move through its ops (kernels/moe_ops.hpp), the gate's too (kernels/moe_gate.hpp): its
// decisions (route positions and weights, N x K) stay there, and only its summary (E counts and the
// losses) comes to the host, once per layer's forward, to size the experts' rows and the
// all-to-all. On a device backend the all-to-all stages the rows through host memory.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "hpct/core/error.hpp"
#include "hpct/core/rng.hpp"
#include "hpct/model/gpt.hpp"
#include "hpct/model/moe.hpp"
#include "hpct/model/moe_gate.hpp"
#include "gpt_acts.hpp"

namespace hpct::model {

using kernels::Precision;

GateConfig gate_config(const MoeConfig& m, int experts, bool training) {
  GateConfig g;
  g.num_experts = experts;
  g.topk = m.topk;
  g.capacity_factor = training ? m.train_capacity_factor : m.eval_capacity_factor;
  g.min_capacity = m.min_capacity;
  g.drop_tokens = m.drop_tokens;
  g.use_rts = m.use_rts;
  g.second_expert_sampling = m.second_expert_sampling;
  g.noise = m.noisy_gate_policy == "RSample" ? GateNoise::rsample
            : m.noisy_gate_policy == "Jitter" ? GateNoise::jitter
                                              : GateNoise::none;
  return g;
}

namespace {

// Rows of (expert-major) order: from the send layout [dest][local expert][slot] to the receive
// layout [local expert][source][slot], and back.
void regroup(kernels::OpsBackend& ops, const float* in, float* out, const std::vector<int>& counts, int ranks,
             int local, int C, bool to_expert_major) {
  // counts[s*local + j]: rows of local expert j from/to rank s
  std::vector<size_t> src_major(ranks * local + 1, 0), exp_major(ranks * local + 1, 0);
  for (int s = 0, i = 0; s < ranks; ++s)
    for (int j = 0; j < local; ++j, ++i) src_major[i + 1] = src_major[i] + counts[s * local + j];
  std::vector<size_t> start(ranks * local);
  size_t at = 0;
  for (int j = 0; j < local; ++j)
    for (int s = 0; s < ranks; ++s) start[s * local + j] = at, at += counts[s * local + j];
  for (int i = 0; i < ranks * local; ++i) {
    const size_t n = (size_t)counts[i] * C * sizeof(float);
    if (to_expert_major) ops.copy(out + start[i] * C, in + src_major[i] * C, n);
    else ops.copy(out + src_major[i] * C, in + start[i] * C, n);
  }
}

// Duplicate token dropping (TED): every tensor-parallel rank routes the same rows, so each sends
// only its share of every run of rows (a run: one (rank, local expert) pair's rows, counts[i]) and
// the tensor-parallel group gathers the shares back after the all-to-all. Rank t of T takes rows
// [c*t/T, c*(t+1)/T) of a run of c: the shares partition the run whatever c (no padding to a
// multiple of T as DeepSpeed's capacity split needs).
long long share_lo(long long c, int t, int T) { return c * t / T; }

std::vector<int> share_counts(const std::vector<int>& counts, int t, int T) {
  std::vector<int> out(counts.size());
  for (size_t i = 0; i < counts.size(); ++i)
    out[i] = static_cast<int>(share_lo(counts[i], t + 1, T) - share_lo(counts[i], t, T));
  return out;
}

// full: runs packed in order; part: rank t's share of each run, packed in the same order.
void take_share(const float* full, float* part, const std::vector<int>& counts, int t, int T, int C) {
  size_t at = 0, out = 0;
  for (int c : counts) {
    const long long lo = share_lo(c, t, T), hi = share_lo(c, t + 1, T);
    std::memcpy(part + out * C, full + (at + lo) * C, (size_t)(hi - lo) * C * sizeof(float));
    out += hi - lo, at += c;
  }
}

// gathered: every rank's part (take_share) in rank order; full: the runs whole again.
void join_shares(const float* gathered, float* full, const std::vector<int>& counts, int T, int C) {
  const float* in = gathered;
  for (int t = 0; t < T; ++t) {
    size_t at = 0;
    for (int c : counts) {
      const long long lo = share_lo(c, t, T), hi = share_lo(c, t + 1, T);
      std::memcpy(full + (at + lo) * C, in, (size_t)(hi - lo) * C * sizeof(float));
      in += (hi - lo) * C, at += c;
    }
  }
}

// Rows of local expert j from every source rank (runs indexed (rank, local expert)).
int expert_rows(const std::vector<int>& counts, int ranks, int local, int j) {
  int rows = 0;
  for (int s = 0; s < ranks; ++s) rows += counts[s * local + j];
  return rows;
}

size_t total(const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), size_t(0)); }

// Bytes of C-float rows this rank (self) sends to the others, rows[d] to rank d.
double sent_bytes(const std::vector<int>& rows, int self, int C) {
  double b = 0;
  for (size_t d = 0; d < rows.size(); ++d)
    if ((int)d != self) b += rows[d] * double(C) * sizeof(float);
  return b;
}

// Rows per ep rank of runs indexed (rank, local expert).
std::vector<int> rows_per_rank(const std::vector<int>& counts, int ranks) {
  const int local = static_cast<int>(counts.size()) / ranks;
  std::vector<int> out(ranks, 0);
  for (int d = 0; d < ranks; ++d)
    for (int j = 0; j < local; ++j) out[d] += counts[d * local + j];
  return out;
}
}  // namespace

// One MoE layer's saved state for backward (one set per layer, or one shared with recompute). With
// CAC the routing, exchanged rows and outputs are kept per MoE layer and the experts' hidden
// activations (fch, fch_gelu, y) live in the shared set. Rows, the gate's arrays and weights are in
// the backend's memory; its summary and the exchanges' counts on the host.
struct Moe::Acts {
  explicit Acts(kernels::OpsBackend& be)
      : xr(be), jitter(be), logits(be), probs(be), weight(be), expert(be), slot(be), pos(be), source(be), summary(be),
        scratch(be), rows(be), fch(be), fch_gelu(be), y(be), yback(be), moe_out(be), dense_out(be), coef(be) {}
  BackendArray<float> xr;       // (N, C) router input (jittered x; empty without jitter)
  BackendArray<float> jitter;   // (N, C) the jitter factors
  BackendArray<float> logits;   // (N, E)
  // The gate's arrays (kernels::GateRoutes): pos is each route's row in the send buffer (-1 =
  // dropped), source the token of each send row, weight the routes' combine weights.
  BackendArray<float> probs, weight;
  BackendArray<int32_t> expert, slot, pos, source;
  BackendArray<int64_t> summary;
  BackendArray<double> scratch;
  kernels::GateSummary gate;    // the summary, read back
  std::vector<int> send_counts;  // (ep, El) = (E): rows to expert e = d*El + j (its kept load)
  std::vector<int> recv_counts;  // (ep, El): rows from source s for local expert j
  BackendArray<float> rows;     // (R, C) received rows, grouped by local expert
  BackendArray<float> fch, fch_gelu;  // (R, 4C)
  BackendArray<float> y;        // (R, C) expert outputs
  BackendArray<float> yback;    // (S, C) outputs back in send order
  BackendArray<float> moe_out, dense_out, coef;  // residual MoE: (N, C), (N, C), (N, 2) softmaxed
  int N = 0;

  kernels::GateRoutes routes() const {
    kernels::GateRoutes r;
    r.probs = probs.data(), r.weight = weight.data(), r.expert = expert.data(), r.slot = slot.data();
    r.pos = pos.data(), r.source = source.data(), r.summary = summary.data(), r.scratch = scratch.data();
    return r;
  }
  /// The gate's arrays for N tokens, E experts, K routes each.
  kernels::GateRoutes size_routes(int N, int E, int K) {
    const size_t routes = (size_t)N * K;
    probs.resize((size_t)N * E), weight.resize(routes), expert.resize(routes), slot.resize(routes);
    pos.resize(routes), source.resize(routes), summary.resize(kernels::gate_summary_words(E)), scratch.resize(N);
    return this->routes();
  }
};

Moe::Moe(const GptConfig& cfg, kernels::OpsBackend& ops, TensorParallel& tp, const Mlp& mlp, const comm::Communicator* ep,
         int dense_width)
    : cfg_(cfg), ops_(&ops), tp_(tp), mlp_(mlp), ep_(ep), dense_width_(dense_width) {
  if (ep_) ep_size_ = ep_->size(), ep_rank_ = ep_->rank();
}

Moe::~Moe() = default;

void Moe::clear_kept() { kept_.clear(); }

int Moe::expert_width() const { return cfg_.moe.expert_tensor_parallel ? dense_width_ : cfg_.ffn(); }

bool Moe::drops_duplicate_tokens() const { return cfg_.moe.drop_duplicate_tokens && tp_.enabled() && ep_size_ > 1; }

// One all-to-all of expert rows: to the experts (in: send layout, runs send_counts; out: receive
// layout, runs recv_counts) or back (the reverse). With duplicate token dropping each
// tensor-parallel rank exchanges its share only and the group gathers the rest. `partial` (back
// only): `in` holds this rank's partial sums of tensor-parallel experts, summed over the group on
// the way (a reduce-scatter into the shares with dropping, else an all-reduce). `in` is scratch.
void Moe::exchange(const Acts& m, float* in, float* out, int C, bool to_experts, bool partial) {
  const std::vector<int>& rin = to_experts ? m.send_counts : m.recv_counts;
  const std::vector<int>& rout = to_experts ? m.recv_counts : m.send_counts;
  const int P = ep_size_, T = tp_.size();
  const double row = double(C) * sizeof(float);
  if (!drops_duplicate_tokens()) {
    const std::vector<int> sr = rows_per_rank(rin, P), rr = rows_per_rank(rout, P);
    if (partial && T > 1) {
      tp_.moe_all_reduce(in, total(rin) * C);
      tp_bytes_ += 2.0 * (T - 1) / T * total(rin) * row;  // a ring all-reduce, per rank
    }
    alltoall_bytes_ += sent_bytes(sr, ep_rank_, C);
    alltoall_calls_ += P > 1;
    if (P == 1) {
      ops_->copy(out, in, (size_t)sr[0] * C * sizeof(float));
    } else if (ops_->host_memory()) {
      ep_->alltoallv_rows(in, sr, out, rr, C);
    } else {  // device rows through host buffers (MPI here is not CUDA-aware)
      std::vector<float> hin(total(sr) * C), hout(total(rr) * C);
      ops_->copy_to_host(hin.data(), in, hin.size() * sizeof(float));
      ep_->alltoallv_rows(hin.data(), sr, hout.data(), rr, C);
      ops_->copy_from_host(out, hout.data(), hout.size() * sizeof(float));
    }
    return;
  }
  if (!ops_->host_memory()) {  // device rows through host buffers, as the all-to-all above
    std::vector<float> hin(total(rin) * C), hout(total(rout) * C);
    ops_->copy_to_host(hin.data(), in, hin.size() * sizeof(float));
    exchange_shares(rin, rout, hin.data(), hout.data(), C, partial);
    ops_->copy_from_host(out, hout.data(), hout.size() * sizeof(float));
    return;
  }
  exchange_shares(rin, rout, in, out, C, partial);
}

// Duplicate token dropping's exchange on host memory: this rank's share of every run of rin
// (summed over the group when partial), the all-to-all, then the group's all-gather of the other
// shares into the runs of rout.
void Moe::exchange_shares(const std::vector<int>& rin, const std::vector<int>& rout, float* in, float* out, int C,
                          bool partial) {
  const int P = ep_size_, T = tp_.size(), t = tp_.rank();
  const double row = double(C) * sizeof(float);
  std::vector<int> in_pieces(T), out_pieces(T);
  for (int u = 0; u < T; ++u) in_pieces[u] = (int)total(share_counts(rin, u, T)), out_pieces[u] = (int)total(share_counts(rout, u, T));
  std::vector<float> part((size_t)in_pieces[t] * C);
  if (partial) {
    std::vector<float> by_rank(total(rin) * C);  // every rank's share of every run, rank-major
    for (int u = 0, at = 0; u < T; at += in_pieces[u], ++u) take_share(in, &by_rank[(size_t)at * C], rin, u, T, C);
    tp_.moe_reduce_scatter(by_rank.data(), part.data(), in_pieces, C);
    tp_bytes_ += double(total(rin) - in_pieces[t]) * row;
  } else {
    take_share(in, part.data(), rin, t, T, C);
  }
  const std::vector<int> sr = rows_per_rank(share_counts(rin, t, T), P), rr = rows_per_rank(share_counts(rout, t, T), P);
  const size_t before = std::accumulate(out_pieces.begin(), out_pieces.begin() + t, size_t(0));
  std::vector<float> gathered(total(rout) * C);
  alltoall_bytes_ += sent_bytes(sr, ep_rank_, C);
  ++alltoall_calls_;
  ep_->alltoallv_rows(part.data(), sr, gathered.data() + before * C, rr, C);
  // The other ranks' shares, and every run whole again.
  tp_.moe_all_gather(gathered.data(), out_pieces, C);
  tp_bytes_ += double(total(rout) - out_pieces[t]) * row;
  join_shares(gathered.data(), out, rout, T, C);
}

Moe::Acts& Moe::acts(int set) {
  if (acts_.size() <= static_cast<size_t>(set)) acts_.resize(set + 1);
  if (!acts_[set]) acts_[set] = std::make_unique<Acts>(*ops_);
  return *acts_[set];
}

Moe::Acts& Moe::state(const LayerTensors& o, int set, bool keep_per_layer) {
  if (!keep_per_layer) return acts(set);  // evaluation, or no CAC: the shared set
  if (kept_.size() <= static_cast<size_t>(o.moe_index)) kept_.resize(o.moe_index + 1);
  if (!kept_[o.moe_index]) kept_[o.moe_index] = std::make_unique<Acts>(*ops_);
  return *kept_[o.moe_index];
}

size_t Moe::kept_bytes() const {
  size_t b = 0;
  for (const auto& m : kept_) {
    if (!m) continue;
    b += (m->xr.capacity() + m->jitter.capacity() + m->logits.capacity() + m->probs.capacity() + m->weight.capacity() +
          m->rows.capacity() + m->yback.capacity() + m->moe_out.capacity() + m->dense_out.capacity() +
          m->coef.capacity()) * sizeof(float);
    b += (m->expert.capacity() + m->slot.capacity() + m->pos.capacity() + m->source.capacity() +
          m->send_counts.capacity() + m->recv_counts.capacity()) * sizeof(int32_t);
    b += (m->summary.capacity() + m->scratch.capacity()) * sizeof(int64_t);
  }
  return b;
}

void Moe::forward(const Pass& p, ParamStore& store, const LayerTensors& o, int l, const float* lp, const Dense& dense,
                  const float* x, float* out, int N, int set) {
  const int C = cfg_.hidden_size, E = o.experts, K = cfg_.moe.topk, P = ep_size_, El = E / P;
  Acts& m = state(o, set, p.keep_per_layer);  // routing and exchanged rows (kept per layer with CAC)
  Acts& xa = acts(set);                       // the experts' hidden activations
  const int F = expert_width(), W = mlp_.fc_width(F);  // act rows F wide, fch rows W (SwiGLU: 2F)
  const bool split = cfg_.moe.expert_tensor_parallel && tp_.enabled();
  if (p.replaying) {
    // CAC's replay: the experts' hidden activations from the kept rows, the residual MoE's dense
    // MLP's likewise; the routing, the exchanges and the outputs are the forward's.
    const size_t R = m.rows.size() / C;
    xa.fch.resize(R * W);
    xa.fch_gelu.resize(R * F);
    size_t row = 0;
    for (int j = 0; j < El; ++j) {
      const int rows = expert_rows(m.recv_counts, P, El, j);
      const int b = o.expert_blocks[ep_rank_ * El + j];
      const float* w = store.params(b);
      if (rows > 0)
        mlp_.hidden(MlpWeights::at(w, o.expert_mlp, store.params16(b)), m.rows.data() + row * C, xa.fch.data() + row * W,
                    xa.fch_gelu.data() + row * F, rows, F, nullptr);
      store.release(b);
      row += rows;
    }
    if (cfg_.moe.residual) mlp_.hidden(dense.w, x, dense.fch, dense.fch_gelu, N, dense.width, nullptr);
    return;
  }
  m.N = N;
  const bool training = p.training;
  const GateConfig gc = gate_config(cfg_.moe, E, training);
  const uint64_t seed = mix_seed(routing_seed_, static_cast<uint64_t>(l), 0x6d6f65);

  // Router, fp32. Jitter multiplies the router's input only (DeepSpeed's multiplicative_jitter).
  const float* xr = x;
  if (training && gc.noise == GateNoise::jitter) {
    std::vector<float> f((size_t)N * C);
    for (int n = 0; n < N; ++n) {
      Rng rng(mix_seed(seed, static_cast<uint64_t>(n), 0x6a6974));
      for (int c = 0; c < C; ++c) f[(size_t)n * C + c] = static_cast<float>(1.0 - 1e-2 + 2e-2 * rng.uniform());
    }
    m.jitter.upload(f.data(), f.size());
    ops_->multiply(m.xr.resize(f.size()), x, m.jitter.data(), f.size(), /*accumulate=*/false);
    xr = m.xr.data();
  } else {
    m.jitter.clear();
    m.xr.clear();
  }
  ops_->matmul_forward(m.logits.zeros((size_t)N * E), xr, lp + o.routerw, nullptr, N, C, E, Precision::fp32);

  // Gate, on the backend; then its summary, read once, sizes the rows of every expert. Without
  // dropping, no expert is asked for more than N slots (a token's k choices are distinct experts),
  // so capacity N keeps every route: the rows move by counts, not padded to an agreed capacity, and
  // DeepSpeed's largest demand over the group would give the same slots at the cost of a read-back
  // and an all-reduce per layer.
  const kernels::GateRoutes gr = m.size_routes(N, E, K);
  ops_->moe_gate_select(gr, m.logits.data(), N, gc, seed, training);
  std::vector<int64_t> words(kernels::gate_summary_words(E));
  const int capacity = gc.drop_tokens ? moe_capacity(N, gc) : N;
  ops_->moe_gate_assign(gr, N, capacity, gc, seed);
  ops_->copy_to_host(words.data(), m.summary.data(), words.size() * sizeof(int64_t));
  m.gate = kernels::GateSummary::read(words.data(), E);
  note_routing(o.moe_index, N, K, m.gate);

  // Dispatch: send buffer ordered by (expert, slot); experts of rank d are contiguous.
  const size_t S = static_cast<size_t>(m.gate.kept());
  BackendArray<float> send(*ops_);
  ops_->gather_rows(send.resize(S * C), x, m.source.data(), S, C);
  // Counts: rows of (dest rank d, its local expert j), and what comes back from each source.
  std::vector<int>& sc = m.send_counts;
  std::vector<int>& rc = m.recv_counts;
  sc.assign(m.gate.load.begin(), m.gate.load.end());  // expert e = d*El + j
  rc.resize(P * El);
  if (P > 1) {
    ep_->alltoall(sc.data(), rc.data(), El);
    alltoall_bytes_ += double(P - 1) * El * sizeof(int);
  } else {
    rc = sc;
  }
  size_t R = 0;
  for (int v : rc) R += v;
  BackendArray<float> recv(*ops_);
  exchange(m, send.data(), recv.resize(R * C), C, /*to_experts=*/true);
  regroup(*ops_, recv.data(), m.rows.resize(R * C), rc, P, El, C, true);

  // Experts: one MLP per local expert over its rows (every source's rows in one GEMM). Tensor-
  // parallel experts hold F = 4C/T of the hidden width: partial outputs, summed on the way back.
  xa.fch.resize(R * W);
  xa.fch_gelu.resize(R * F);
  xa.y.resize(R * C);
  size_t row = 0;
  for (int j = 0; j < El; ++j) {
    const int rows = expert_rows(rc, P, El, j);
    const int b = o.expert_blocks[ep_rank_ * El + j];
    const float* w = store.params(b);
    if (rows > 0) {
      MlpWeights ew = MlpWeights::at(w, o.expert_mlp, store.params16(b));
      if (split && tp_.rank() != 0) ew.projb = nullptr;  // the bias once over the group
      mlp_.forward(ew, m.rows.data() + row * C, xa.fch.data() + row * W, xa.fch_gelu.data() + row * F,
                   xa.y.data() + row * C, rows, F, nullptr);
    }
    store.release(b);
    row += rows;
  }

  // Return and combine: a dropped route adds nothing (the residual stream carries the token).
  BackendArray<float> back(*ops_);
  regroup(*ops_, xa.y.data(), back.resize(R * C), rc, P, El, C, false);
  exchange(m, back.data(), m.yback.resize(S * C), C, /*to_experts=*/false, /*partial=*/split);
  float* moe_out = cfg_.moe.residual ? m.moe_out.resize((size_t)N * C) : out;
  ops_->moe_combine(moe_out, m.yback.data(), m.pos.data(), m.weight.data(), N, K, C);
  if (cfg_.moe.residual) {
    // out = c0 * moe + c1 * mlp(x), (c0, c1) = softmax(x Wc^T + bc) per token.
    // The dense MLP beside the experts is tensor-parallel like a dense layer's (the experts are not).
    mlp_.forward(dense.w, x, dense.fch, dense.fch_gelu, m.dense_out.resize((size_t)N * C), N, dense.width, nullptr);
    tp_.all_reduce(m.dense_out.data(), (size_t)N * C);
    ops_->matmul_forward(m.coef.resize((size_t)N * 2), x, lp + o.coefw, lp + o.coefb, N, C, 2, Precision::fp32);
    ops_->residual_mix(out, m.coef.data(), m.moe_out.data(), m.dense_out.data(), N, C);
  }
}

// dout (N, C): d(loss)/d(feed-forward output); dx (N, C) ACCUMULATES d(loss)/d(ln2 output).
void Moe::backward(const Pass& p, ParamStore& store, const LayerTensors& o, const float* lp, float* lg, const Dense& dense,
                   const float* x, const float* dout, float* dx, int N, int set) {
  const int C = cfg_.hidden_size, E = o.experts, K = cfg_.moe.topk, P = ep_size_, El = E / P;
  Acts& m = state(o, set, p.keep_per_layer);
  const Acts& xa = acts(set);
  const size_t S = m.yback.size() / C;

  // Residual MoE: split dout into the expert and dense paths and the coefficient's gradient.
  BackendArray<float> dmoe(*ops_);
  const float* dm = dout;
  if (cfg_.moe.residual) {
    BackendArray<float> dd(*ops_), dlog(*ops_);
    ops_->residual_mix_backward(dmoe.resize((size_t)N * C), dd.resize((size_t)N * C), dlog.resize((size_t)N * 2), dout,
                                m.coef.data(), m.moe_out.data(), m.dense_out.data(), N, C);
    // The dense MLP's part first (it writes dx), summed over the tensor-parallel group (f's
    // backward), then the whole contributions of the coefficient and the experts added.
    mlp_.backward(dense.w, dense.g, x, dense.fch, dense.fch_gelu, dd.data(), dx, N, dense.dfch, dense.dfch_gelu,
                  dense.width, nullptr);
    tp_.all_reduce(dx, (size_t)N * C);
    ops_->matmul_backward(dx, lg + o.coefw, lg + o.coefb, dlog.data(), x, lp + o.coefw, N, C, 2, Precision::fp32);
    dm = dmoe.data();
  }

  // Combine backward: d(y) of each kept route, and d(weight) for the gate.
  BackendArray<float> dyback(*ops_), dweight(*ops_);
  ops_->moe_combine_backward(dyback.zeros(S * C), dweight.resize((size_t)N * K), dm, m.yback.data(), m.pos.data(),
                             m.weight.data(), N, K, C);

  // To the experts, their backward, and the input gradients back.
  const size_t R = m.rows.size() / C;
  BackendArray<float> recv(*ops_), dy(*ops_);
  exchange(m, dyback.data(), recv.resize(R * C), C, /*to_experts=*/true);
  regroup(*ops_, recv.data(), dy.resize(R * C), m.recv_counts, P, El, C, true);
  const int F = expert_width(), W = mlp_.fc_width(F);
  const bool split = cfg_.moe.expert_tensor_parallel && tp_.enabled();
  BackendArray<float> drows(*ops_), dscratch(*ops_), dscratch2(*ops_);
  drows.zeros(R * C);
  dscratch.resize(R * W);
  dscratch2.resize(R * F);
  size_t row = 0;
  for (int j = 0; j < El; ++j) {
    const int rows = expert_rows(m.recv_counts, P, El, j);
    const int b = o.expert_blocks[ep_rank_ * El + j];
    const float* w = store.params(b);
    float* g = store.grads(b);
    if (rows > 0)
      mlp_.backward(MlpWeights::at(w, o.expert_mlp, store.params16(b)), MlpGrads::at(g, o.expert_mlp), m.rows.data() + row * C,
                    xa.fch.data() + row * W, xa.fch_gelu.data() + row * F, dy.data() + row * C,
                    drows.data() + row * C, rows, dscratch.data(), dscratch2.data(), F, nullptr);
    store.release(b);
    store.grads_ready(b);
    row += rows;
  }
  BackendArray<float> back(*ops_), dsend(*ops_);
  regroup(*ops_, drows.data(), back.resize(R * C), m.recv_counts, P, El, C, false);
  exchange(m, back.data(), dsend.resize(S * C), C, /*to_experts=*/false, /*partial=*/split);
  ops_->moe_dispatch_backward(dx, dsend.data(), m.pos.data(), N, K, C);

  // Gate and router (the gate's backward on the backend). The aux and z losses enter the total loss
  // per micro-batch with their coefficients, on the same scale as the token losses' mean (dloss per
  // token x the micro-batch's B*T tokens, which is N unless random-LTD runs this layer on fewer rows).
  const float aux_scale = static_cast<float>(p.dloss * p.batch_rows * cfg_.moe.loss_coeff);
  const float z_scale = static_cast<float>(p.dloss * p.batch_rows * cfg_.moe.z_loss_coeff);
  BackendArray<float> dlogits(*ops_);
  ops_->moe_gate_backward(dlogits.resize((size_t)N * E), m.routes(), m.logits.data(), dweight.data(), N,
                          gate_config(cfg_.moe, E, p.training), aux_scale, z_scale);
  if (m.jitter.empty()) {
    ops_->matmul_backward(dx, lg + o.routerw, nullptr, dlogits.data(), x, lp + o.routerw, N, C, E, Precision::fp32);
  } else {
    BackendArray<float> dxr(*ops_);
    ops_->matmul_backward(dxr.zeros((size_t)N * C), lg + o.routerw, nullptr, dlogits.data(), m.xr.data(),
                          lp + o.routerw, N, C, E, Precision::fp32);
    ops_->multiply(dx, dxr.data(), m.jitter.data(), (size_t)N * C, /*accumulate=*/true);
  }
}

void Moe::note_routing(int moe_index, int N, int K, const kernels::GateSummary& g) {
  if (stats_.size() <= static_cast<size_t>(moe_index)) stats_.resize(moe_index + 1);
  MoeLayerStats& s = stats_[moe_index];
  if (s.load.size() != g.load.size()) s.load.assign(g.load.size(), 0);
  for (size_t e = 0; e < g.load.size(); ++e) s.load[e] += g.load[e];
  s.routes += (long long)N * K;
  s.dropped += g.dropped;
  s.aux_loss += g.aux_loss;
  s.z_loss += g.z_loss;
  s.micro_batches += 1;
  s.routing_hash += g.hash;
}

}  // namespace hpct::model
