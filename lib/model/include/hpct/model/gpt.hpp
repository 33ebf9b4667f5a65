// hpct/model/gpt.hpp — a pre-norm decoder-only transformer with explicit forward and backward,
// dense or MoE: GPT-2 by default, Llama with its options (GptConfig).
//
// Token embeddings (+ learned positions, or rotary ones inside attention), L pre-norm transformer
// blocks, a final norm, and an output head tied to the token embedding or its own. A block is ln1
// (model/norm.hpp: LayerNorm or RMSNorm), causal self-attention (model/attention.hpp: multi-head
// or grouped-query), ln2 and a feed-forward that is either the MLP (model/mlp.hpp: GELU or SwiGLU)
// or a mixture of experts (model/moe.hpp: a router, top-k gating with capacity, experts that are
// the same MLP, and the expert-parallel all-to-all). Gpt is the loop over the layers of the
// tensor table (LayerTensors: which feed-forward each layer has) and the glue the components do not
// own: the residual stream, dropout, random-LTD, recomputation, LoRA, the head and the loss.
// No autograd: the backward is written out, op by op, against hpct::kernels. Activation
// checkpointing per layer keeps only each layer's input and recomputes the layer in backward.
// Not here: optimizer, data parallelism, sharding — the model reads parameters and writes
// gradients through a ParamStore, block by block, so ZeRO-3 can gather a layer just in time and
// a data-parallel engine can reduce a layer's gradients as soon as they are complete.
//
// The parameter list is layout_for(config): one named table that the trainer, the memory
// estimator, the checkpoints and hpct_ckpt all read. Blocks, in order: "embedding", per layer
// "layers.<l>" (attention, norms, and the MLP or the router) followed, in an MoE layer, by one
// block per expert "layers.<l>.mlp.experts.<e>" (ReduceGroup::expert), then "final_norm". LoRA
// adds "embedding.position" (the position embedding, when it trains alone), "embedding.lora" and
// "layers.<l>.lora" after the blocks they adapt.
//
// Tensor parallelism (Megatron-LM; model/tensor_parallel.hpp): with a tensor-parallel group of T
// ranks the layout is this rank's part (ParamLayout's Partition): QKV and fc column-parallel (NH/T
// heads, 4h/T columns), the attention output and fc2 row-parallel, the word embedding and the LM
// head vocab-parallel; norms, position embeddings, row-parallel biases, the router and the experts
// are replicas. Every tensor keeps its full shape and name (the checkpoint schema), so a
// checkpoint does not depend on T. With sequence parallelism the residual stream, the norms and the
// residual adds hold this rank's N/T token rows only; the norms' gradients are summed over the group.
// An MoE layer then gathers every row and routes all of them on every rank, as without it.
//
// The ops run on a kernels::OpsBackend: the CPU one by default, or a CUDA device. Parameters,
// gradients and activations then live in that backend's memory; tokens and targets are passed as
// host arrays and copied in, losses come back to the host. Tensor parallelism runs on either (its
// collectives, and the MoE layer's exchanges, go through host buffers on a device).
//
// Dimension letters: B batch, T sequence, C channels (hidden), L layers, NH heads, V vocab,
// Vp padded vocab, N = B*T rows, E experts, K = topk.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hpct/comm/mpi.hpp"
#include "hpct/core/param_layout.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "hpct/model/attention.hpp"
#include "hpct/model/mlp.hpp"
#include "hpct/model/moe.hpp"
#include "hpct/model/norm.hpp"
#include "hpct/model/param_store.hpp"
#include "hpct/model/tensor_parallel.hpp"

namespace hpct::model {

/// Mixture of experts (Megatron-DeepSpeed's flags; docs/moe.md). Architecture: num_experts,
/// expert_interval, topk, residual. The rest are routing knobs that may change between runs.
struct MoeConfig {
  std::vector<int> num_experts;  // --num-experts: one count, or one per MoE layer; {} or {1}: dense
  int expert_interval = 2;       // --expert-interval: MoE on layers l (1-based) with l % interval == 0
  int topk = 1;                  // --topk: 1 or 2
  bool residual = false;         // --mlp-type residual: dense MLP beside one gated expert (PR-MoE)
  double train_capacity_factor = 1.0, eval_capacity_factor = 1.0;
  int min_capacity = 4;
  bool drop_tokens = true;       // --disable-moe-token-dropping clears it
  bool use_rts = true;           // random token selection (top-1)
  bool second_expert_sampling = true;  // top-2: Gumbel-sampled second expert in training
  std::string noisy_gate_policy = "None";  // None | Jitter | RSample
  double loss_coeff = 0.1;       // --moe-loss-coeff
  double z_loss_coeff = 0;       // --moe-z-loss-coeff (router z-loss; DeepSpeed has none)
  bool drop_duplicate_tokens = true;  // TED's DTD; --disable-duplicate-token-dropping clears it
  bool expert_tensor_parallel = false;  // --enable-expert-tensor-parallelism: experts split like the MLP

  /// Experts of layer l (0-based) of a num_layers model; 0 = the dense MLP.
  int experts_of(int layer, int num_layers) const;
  bool enabled(int num_layers) const;
  int moe_layers(int num_layers) const { return num_layers / expert_interval; }
};

/// LoRA (Hu et al., arXiv 2106.09685; PEFT's LoraConfig): each adapted linear y = x W^T + b gains
/// (alpha / rank) * (x A^T) B^T with A (rank, in) and B (out, rank); A starts random, B at zero, so
/// the adapted model starts as the base. Only the adapters train: every base tensor is frozen (no
/// gradient, no optimizer state, not in checkpoints). Adapters live in one block per layer,
/// "layers.<l>.lora", named "<linear>.lora_a.weight" / "<linear>.lora_b.weight" (docs/finetune.md).
struct LoraConfig {
  // embedding: the tied word embedding (input and LM head), as PEFT adapts nn.Embedding: E + s A B^T
  // with A (padded vocab, rank) starting at zero and B (hidden, rank) at N(0, 1).
  enum Target { qkv = 0, proj = 1, fc = 2, fc2 = 3, embedding = 4 };
  static constexpr const char* kTargetNames[5] = {"qkv", "proj", "fc", "fc2", "embedding"};
  int rank = 0;          // --lora-rank: 0 = off
  double alpha = 0;      // --lora-alpha: the update's scale is alpha / rank; 0 = rank (scale 1)
  unsigned targets = 0xF;  // --lora-targets: a bit per Target (default the four linears, not the embedding)
  // --lora-modules-to-save (PEFT's modules_to_save): base blocks that train in full beside the
  // adapters, a bit per Module. The final norm lets the output's scale and bias move (an
  // undertrained base's rare-token embeddings cap the logits a frozen head can reach).
  // position_embedding: the learned positions alone (T x C), in a block of their own, the word
  // embedding staying frozen (PEFT: modules_to_save=["wpe"] on GPT-2).
  enum Module { final_layernorm = 0, embeddings = 1, position_embeddings = 2 };
  static constexpr int kModules = 3;
  static constexpr const char* kModuleNames[kModules] = {"final_layernorm", "embedding", "position_embedding"};
  unsigned modules_to_save = 0;
  bool enabled() const { return rank > 0; }
  bool adapts(int t) const { return enabled() && (targets >> t & 1u); }
  bool saves(int m) const { return enabled() && (modules_to_save >> m & 1u); }
  /// The position embedding trains in a block apart from the frozen word embedding.
  bool own_position_block() const { return saves(position_embeddings) && !saves(embeddings); }
  double scale() const { return (alpha > 0 ? alpha : rank) / rank; }
  /// "qkv,proj" -> the bits; throws config_error naming --lora-targets for an unknown name.
  static unsigned parse_targets(const std::string& list);
  /// "final_layernorm" -> the bits; throws config_error naming --lora-modules-to-save.
  static unsigned parse_modules(const std::string& list);
  std::string target_list() const;
  std::string module_list() const;
};

struct GptConfig {
  int num_layers = 2;
  int hidden_size = 64;
  int num_heads = 2;
  // --num-key-value-heads (Megatron-LM's --group-query-attention --num-query-groups): key/value
  // heads shared by groups of query heads (GQA; 1: multi-query); 0: one per query head.
  int num_kv_heads = 0;
  // --ffn-hidden-size: the hidden width of every MLP (dense, residual and each expert's); 0 is
  // Megatron's default: 4 x hidden_size, or with SwiGLU int(4h x 2/3 / 64) x 64. ffn() is the width in use.
  int ffn_hidden_size = 0;
  MlpKind mlp = MlpKind::gelu;  // --swiglu: every MLP's kind (model/mlp.hpp)
  bool linear_bias = true;      // --disable-bias-linear clears it: no bias on the attention's and MLPs' linears
  // --untie-embeddings-and-output-weights: the LM head is its own (Vp, C) tensor, "output_layer.weight"
  // in a block of its own after the final norm, instead of the word embedding.
  bool untie_embeddings = false;
  // Positions (Megatron's --position-embedding-type): a learned table added at the input
  // (learned_absolute, GPT-2's), or rotary (--use-rotary-position-embeddings: q and k rotated in
  // every attention, no table) on the first rotary_percent of each head's channels, base rope_theta.
  bool rotary = false;
  double rotary_percent = 1.0;  // --rotary-percent
  double rope_theta = 10000.0;  // --rope-theta (Megatron-LM's --rotary-base)
  /// Rotary positions' channels per head (0: learned positions): int(head size x rotary_percent).
  int rotary_dims() const { return rotary ? static_cast<int>(hidden_size / num_heads * rotary_percent) : 0; }
  NormKind normalization = NormKind::layernorm;  // --normalization: every norm's kind (model/norm.hpp)
  int max_seq_length = 64;  // the longest sequence trained on (--seq-length)
  int max_position_embeddings = 0;  // learned position table rows (Megatron's flag); 0: max_seq_length
  int vocab_size = 256;     // tokenizer's vocabulary
  int vocab_multiple = 128; // Megatron's --make-vocab-size-divisible-by
  double init_std = 0.02;   // Megatron's --init-method-std
  MoeConfig moe;
  int tensor_parallel = 1;  // --tensor-model-parallel-size: ranks each layer is split over
  bool sequence_parallel = false;  // --sequence-parallel: norms and residuals on 1/T of the tokens
  // Dropout in training (Megatron's places): attention_dropout on the attention probabilities,
  // hidden_dropout on the embedding output and on the attention and MLP (or MoE) outputs before
  // their residual adds. 0: off, the model bitwise without it. Masks: kernels/dropout.hpp.
  double attention_dropout = 0.0;  // --attention-dropout
  double hidden_dropout = 0.0;     // --hidden-dropout
  // Documents packed in a sample, each ending at an eod_token in the input (Megatron's
  // get_ltor_masks_and_position_ids): with reset_attention_mask a token attends to its own
  // document's tokens only, with reset_position_ids positions restart at 0 after each eod_token.
  // Off: the sample is one sequence (Megatron's default). Generation (decoder.hpp) is unaffected.
  bool reset_attention_mask = false;  // --reset-attention-mask
  bool reset_position_ids = false;    // --reset-position-ids
  int eod_token = -1;                 // the tokenizer's end-of-document id (needed by the two above)
  LoraConfig lora;                    // --lora-rank etc.: low-rank adapters on a frozen base

  /// The vocabulary padded to a multiple of lcm(vocab_multiple, tensor_parallel): with the default
  /// 128 and a power-of-two T up to 128 that is the same table at every T (GPT-2: 50304), so a
  /// checkpoint moves between tensor-parallel sizes unchanged. (Megatron pads to 128*T instead:
  /// 50432 at T=2, which ties its checkpoints to T.)
  int padded_vocab() const;
  /// The multiple padded_vocab() rounds to.
  long long vocab_granule() const;
  int kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  int ffn() const {
    if (ffn_hidden_size > 0) return ffn_hidden_size;
    return mlp == MlpKind::swiglu ? static_cast<int>(4.0 * hidden_size * 2 / 3 / 64) * 64 : 4 * hidden_size;
  }
  /// Rows of the position table: the longest sequence the model can read (generation included).
  int positions() const { return max_position_embeddings > 0 ? max_position_embeddings : max_seq_length; }
  /// Throws config_error naming the flag for impossible shapes.
  void validate() const;
  std::string describe() const;
};

struct Routing;  // moe_gate.hpp

/// One transformer layer's tensors, as the model and the tools that compute with its parameters
/// (the decoder) read them: offsets relative to the start of the layer's schema block (each expert's
/// relative to its own block: every expert alike), and what its feed-forward is.
struct LayerTensors {
  int block = 0;                  // schema block id of the dense part ("layers.<l>")
  NormTensors ln1, ln2;           // before the attention, before the feed-forward
  AttentionTensors attn;
  MlpTensors mlp;                 // the dense MLP (or the residual MLP beside the experts)
  MlpTensors expert_mlp;          // inside each expert block
  int experts = 0;                // 0: dense MLP; else E experts routed by `router`
  size_t routerw = 0;             // (E, C)
  size_t coefw = 0, coefb = 0;    // residual MoE: (2, C), (2)
  std::vector<int> expert_blocks; // schema block of each expert (global index)
  int moe_index = -1;             // which MoE layer (0-based) this is
  int lora_block = -1;            // LoRA: the layer's adapter block ("layers.<l>.lora"), or -1
  size_t lora_a[4] = {}, lora_b[4] = {};  // per LoraConfig::Target, offsets in that block
};

/// Every tensor the model computes with, located in its layout: the layers, the embeddings and the
/// final norm (offsets relative to their blocks).
struct GptTensors {
  std::vector<LayerTensors> layers;
  int embedding_block = 0;   // "embedding": the word embeddings (and the head tied to them)
  size_t wte = 0;
  int position_block = 0;    // the embedding's, or LoRA's "embedding.position"
  size_t wpe = 0;
  bool learned_positions = true;  // false: rotary positions, no table (wpe, position_block unused)
  int final_block = 0;       // "final_norm"
  NormTensors final_norm;
  int output_block = -1;     // untied: "output_layer", the LM head's own block; -1: the head is wte
  size_t output = 0;         // its weight (Vp, C), offset in that block
};

class Gpt {
 public:
  /// ops: the backend the model computes on, which must outlive the model; nullptr = the CPU one.
  /// ep: the expert-parallel group (MoE: this rank holds experts [ep.rank()*E/ep.size(), ...) of
  /// every MoE layer and exchanges tokens over it); nullptr = this rank holds every expert.
  /// tp: the tensor-parallel group, of size cfg.tensor_parallel (nullptr when that is 1).
  Gpt(const GptConfig& cfg, kernels::Precision precision, bool recompute_activations,
      kernels::OpsBackend* ops = nullptr, const comm::Communicator* ep = nullptr,
      const comm::Communicator* tp = nullptr);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  kernels::OpsBackend& ops() const { return *ops_; }

  const GptConfig& config() const { return cfg_; }
  /// Every tensor of the model (all experts, whatever the rank holds), as this tensor-parallel
  /// rank's parts (the full layout at T = 1): names and full shapes are the checkpoint schema.
  const ParamLayout& layout() const { return layout_; }
  /// The same table without building a model (the estimator, hpct_ckpt), for tensor-parallel rank
  /// tp_rank of cfg.tensor_parallel; where each tensor the model computes with lies in it into
  /// `tensors` when given. Throws for a bad config.
  static ParamLayout layout_for(const GptConfig& cfg, int tp_rank = 0, GptTensors* tensors = nullptr);
  /// Schema blocks this rank computes with: every dense block and its own experts, in order.
  std::vector<int> held_blocks() const;
  kernels::Precision precision() const { return precision_; }
  /// The backend's attention kernel for this model's micro-batches of B x T (the start line's).
  kernels::AttentionKernel attention_kernel(int B, int T) const { return attention_.kernel(B, T); }

  /// GPT-2 / Megatron init: N(0, std) weights, output projections N(0, std/sqrt(2L)), zero biases,
  /// unit norm weights. Deterministic in the seed, independent of the rank layout.
  void init_params(float* params, uint64_t seed) const;
  /// The same values for one block only: dst receives the block's elements (as at its layout
  /// offset in init_params), so a sharded store initialises without a full copy.
  void init_block(int block, float* dst, uint64_t seed) const;

  /// Forward and backward of one micro-batch. tokens/targets are (B, T) host arrays; a target < 0
  /// is ignored.
  /// Gradients are ACCUMULATED into the store with d(loss)/d(logit) scaled by dloss (so the caller
  /// chooses the mean over the global batch and any loss scale). Returns the SUM of token losses.
  double forward_backward(ParamStore& store, const int32_t* tokens, const int32_t* targets, int B, int T, float dloss);
  /// Forward only (evaluation). Returns the sum of token losses (targets < 0 add nothing).
  double forward_loss(ParamStore& store, const int32_t* tokens, const int32_t* targets, int B, int T);
  /// Wall seconds forward_backward spent since construction in its two halves: the embedding and
  /// the layers' forward; then the rest (the LM head's logits, loss and gradient, fused chunk by
  /// chunk, and the layers' backward with any recompute). The store's waits inside them (ZeRO-3
  /// gathers, reductions overlapped with backward) count too. No device synchronisation is added:
  /// with a GPU backend part of the forward's kernels may finish inside the second half.
  struct PhaseSeconds {
    double forward = 0, backward = 0;
  };
  PhaseSeconds phase_seconds() const { return phase_; }
  /// The backend's markers (OpsBackend::mark) of each forward_backward since clear_marks(): its
  /// start, the end of its forward, the end of its backward; -1 each on a backend without them.
  struct Marks {
    int start = -1, forward_end = -1, backward_end = -1;
  };
  const std::vector<Marks>& marks() const { return marks_; }
  void clear_marks() { marks_.clear(); }

  // ---- mixture of experts ----
  /// Routing noise and random token selection of the next micro-batch derive from this seed (the
  /// trainer passes a function of the run seed and the micro-batch's first global sample, so the
  /// routing does not depend on the rank layout).
  void set_routing_seed(uint64_t seed) { moe_->set_routing_seed(seed); }
  /// Per MoE layer, summed over the micro-batches since reset_moe_stats(): this rank's tokens.
  using MoeLayerStats = model::MoeLayerStats;
  const std::vector<MoeLayerStats>& moe_stats() const { return moe_->stats(); }
  void reset_moe_stats() { moe_->reset_stats(); }
  /// Bytes this rank sent to other ranks in MoE all-to-alls since construction (rows and counts).
  double alltoall_bytes() const { return moe_->alltoall_bytes(); }
  /// Duplicate token dropping (TED; tensor and expert parallelism together, unless
  /// --disable-duplicate-token-dropping): each tensor-parallel rank sends 1/T of the routed rows
  /// through the all-to-all and the tensor-parallel group all-gathers them.
  /// moe_tp_bytes: what a ring moves per rank in the MoE layers' tensor-parallel collectives since
  /// construction (those gathers, and tensor-parallel experts' reduce-scatters or all-reduces).
  bool drops_duplicate_tokens() const { return moe_->drops_duplicate_tokens(); }
  double moe_tp_bytes() const { return moe_->tp_bytes(); }
  /// The tensor-parallel collectives since construction (bytes all-reduced; TensorParallel).
  const TensorParallel& tensor_parallel() const { return tp_; }
  /// The tensor-parallel collectives on a device backend's buffers (TensorParallel::set_device_comm).
  void set_tensor_parallel_device_comm(comm::DeviceCollectives* dc, double timeout_s) { tp_.set_device_comm(dc, timeout_s); }

  /// Communication-aware activation checkpointing (TED's CAC; --communication-aware-checkpointing):
  /// with recomputation, the forward keeps what its collectives produced (each layer's post-attention
  /// residual, each MoE layer's routing, exchanged rows and returned outputs) and the recompute pass
  /// replays the layer from them without communicating, computing only what backward reads. Call
  /// before the first step. No effect without recomputation.
  void set_communication_aware_checkpointing(bool on);
  bool keeps_communication() const { return cac_ && recompute_; }
  /// Whether the workspace keeps the activations the GEMMs read (the norms', attention's and the MLP
  /// activation's outputs) in 16 bits, halving them: where the backend asks for it
  /// (OpsBackend::half_activations: the CUDA backend in bf16/fp16 runs) and every reader takes them
  /// so: not under sequence parallelism (its gathers move fp32 rows) and no adapters on the
  /// embedding (their head products read the final norm's output in fp32). An MoE layer's ln2 and
  /// its residual MLP's activation stay fp32 (the router and the experts' row moves read them):
  /// fp32 in the activation sets MoE layers use (set_feeds_moe).
  bool keeps_half_activations() const;
  /// Whether the dense GELU MLPs keep their pre-activation (fc's output, (N, 4C), read only by GELU
  /// and its backward) in 16 bits too, as autocast does: with keeps_half_activations, where the
  /// backend asks (OpsBackend::half_pre_activations), except an MLP with an adapter on fc (LoRA
  /// adds to the fp32 output) and in the sets MoE layers use. GELU then reads the rounded value, and
  /// its gradient is 16-bit too (fc's GEMMs round it anyway; fc's bias gradient sums the 16 bits).
  bool keeps_half_pre_activations() const;
  /// Whether the LM head keeps its logits (and their gradient) in 16 bits, as PyTorch's autocast
  /// does: where the backend asks (OpsBackend::half_logits: the CUDA backend in bf16/fp16), without
  /// tensor parallelism (the vocab-parallel cross entropy reads fp32) or embedding adapters (their
  /// head products add fp32 logits). The loss is then that of the rounded logits.
  bool keeps_half_logits() const;
  /// Bytes CAC holds for the replay (0 without it): the kept residuals and MoE state, as of the last step.
  size_t kept_for_replay_bytes() const;
  /// Row all-to-alls issued by the MoE layers since construction (2 per MoE layer forward, 2 backward,
  /// 2 more per layer when recomputation replays the forward without CAC).
  long long alltoall_calls() const { return moe_->alltoall_calls(); }

  /// Dropout masks of the next training micro-batches derive from this seed and sample b's global
  /// index first_sample + b (kernels/dropout.hpp): the same on any rank layout, in a recompute pass
  /// and after a resume. Evaluation (forward_loss) never drops.
  void set_dropout_seed(uint64_t seed, long long first_sample) { drop_seed_ = seed, drop_first_ = first_sample; }

  // ---- random-LTD (random layerwise token dropping; docs/data-efficiency.md) ----
  /// Layers (0-based) that, in training, run on a random subset of each sample's tokens: the kept
  /// rows are gathered, the layer runs on them as a shorter sequence (causal among the kept tokens,
  /// which keep the position embeddings they were given), its outputs are scattered back, and the
  /// dropped rows pass the layer unchanged. {} = none. Call before the first step. Throws for a
  /// layer out of range, under sequence parallelism and on a device backend (host code for now).
  void set_random_ltd_layers(std::vector<int> layers);
  const std::vector<int>& random_ltd_layers() const { return ltd_layers_; }
  /// The next training micro-batches keep `kept` of each sample's T tokens in those layers (kept <= 0
  /// or >= T: none dropped, the plain model bitwise). Sample b's positions in layer l are a uniform
  /// random subset, sorted, drawn from mix_seed(seed, first_sample + b, l): a function of the
  /// global sample, not of the rank layout.
  void set_kept_tokens(int kept, uint64_t seed, long long first_sample) {
    ltd_kept_ = kept, ltd_seed_ = seed, ltd_first_ = first_sample;
  }
  /// The positions kept in layer l for sample b of the last training micro-batch (empty: none dropped).
  std::vector<int> kept_positions(int layer, int b) const;

  /// Allocates the activations for micro-batches up to B x T now, so that shorter ones (sequence-length
  /// warmup) reuse them and the peak is taken at the start. Throws as a step of that shape would.
  void reserve(int B, int T) { ensure_workspace(B, T); }
  /// Bytes of activations and scratch currently allocated (grows to the largest (B, T) seen), in the
  /// backend's memory, with the scratch the backend keeps for its ops (OpsBackend::scratch_bytes).
  size_t activation_bytes() const;
  /// The bytes reserve(B, T) takes in the backend's memory (activations, the LM head's row block,
  /// the device's per-row inputs), without taking them: the pre-flight memory check. Not counted:
  /// the backend's scratch for its ops, and an MoE layer's routed rows (they follow the routing).
  size_t workspace_bytes(int B, int T) const;
  /// Model FLOPs of one forward+backward over B*T tokens (2 per multiply-add; x3 for fwd+bwd,
  /// +1 forward when activations are recomputed), for TFLOP/s reporting; random-LTD's layers at
  /// `kept` tokens per sample when 0 < kept < T.
  double flops_per_iteration(long long B, long long T, int kept = 0) const;

 private:
  struct LayerActs;
  struct Workspace;
  using Block = LayerTensors;
  void ensure_workspace(int B, int T);
  struct Sizes {  // the workspace of a (B, T): its dimensions and floats (sizes())
    size_t N = 0, C = 0, L = 0, Cl = 0, F = 0, W = 0, Vl = 0, n = 0, sp = 0, nsets = 0, kept = 0, Q = 0, dQ = 0;
    bool half = false;                                  // keeps_half_activations()
    bool half_pre = false;                              // keeps_half_pre_activations()
    bool half_logits = false;                           // keeps_half_logits()
    /// The attention's inputs (Attention::inputs_floats): one buffer every set shares where the
    /// kernel keeps its own copy (Attention::keeps_inputs), else one per set.
    size_t inputs = 0;
    bool shared_inputs = false;
    /// Floats a GEMM input of n elements takes: n, or n 16-bit values in whole 16-byte blocks.
    size_t act(size_t elems) const { return half ? (elems + 7) / 8 * 4 : elems; }
    size_t floats = 0;                                  // ws->mem
    size_t widest = 0, lora_emb = 0, lora_floats = 0;   // LoRA's ws->lora_mem
  };
  Sizes sizes(int B, int T) const;
  /// Whether activation set s is ever an MoE layer's (its ln2 and fch_gelu then stay fp32): set s of
  /// layer s when each layer keeps its own, and set 0, which every layer of a pass without kept
  /// activations (recompute, evaluation) shares.
  bool set_feeds_moe(size_t s) const;
  /// Checks tokens and targets and, on a device backend, copies them in; returns backend pointers.
  std::pair<const int32_t*, const int32_t*> stage_inputs(const int32_t* tokens, const int32_t* targets, int B, int T);
  const float* forward_layers(ParamStore& store, const int32_t* tokens, int B, int T, bool keep_acts);
  /// key_start: each row's first attention key (per-document attention, backend memory), or nullptr;
  /// pos: each row's rotary position (backend memory), or nullptr for its place in the sample.
  void layer_forward(ParamStore& store, int l, const float* lp, LayerActs& a, const float* in, float* out, int B, int T,
                     const int32_t* key_start, const int32_t* pos);
  /// From the micro-batch's host tokens: each token's document start and position when
  /// reset_attention_mask / reset_position_ids are on (doc_start_, doc_pos_; on a device backend
  /// copied into the workspace), and the backend pointers key_start_ / positions_ (nullptr: off).
  void stage_documents(const int32_t* tokens, int B, int T);
  /// random-LTD: key_start_ for layer l's kept rows (each kept row's first kept row of its
  /// document), or nullptr without per-document attention.
  const int32_t* kept_key_start(int l, int B, int T);
  /// random-LTD with rotary positions: layer l's kept rows' positions in their samples (their
  /// documents' with reset_position_ids), backend memory; nullptr with learned positions.
  const int32_t* kept_rotary_positions(int l, int B, int T);
  void layer_backward(ParamStore& store, int l, const float* lp, float* lg, LayerActs& a, const float* in, float* dres,
                      int B, int T, const int32_t* pos);
  /// A dense layer's MLP parameters (lp16: the block's 16-bit copy, or nullptr), fc2's bias on
  /// tensor-parallel rank 0 only (row_bias).
  MlpWeights dense_mlp(const float* lp, const uint16_t* lp16, const Block& o) const {
    MlpWeights w = MlpWeights::at(lp, o.mlp, lp16);
    w.projb = row_bias(w.projb);
    return w;
  }
  /// The attention's parameters, its output bias on tensor-parallel rank 0 only (row_bias).
  AttentionWeights attention(const float* lp, const uint16_t* lp16, const Block& o) const {
    AttentionWeights w = AttentionWeights::at(lp, o.attn, lp16);
    w.projb = row_bias(w.projb);
    return w;
  }
  /// A norm's gradients in a block's gradients g (its bias's null without one).
  static NormGrads norm_grads(float* g, const NormTensors& t) {
    return {g + t.weight, t.bias == NormTensors::none ? nullptr : g + t.bias};
  }
  /// A norm's gradients in the workspace's dnorm from `at` (partial sums, or scratch when frozen):
  /// weight then bias, C each (bias null without one).
  NormGrads scratch_norm_grads(size_t at) const;
  /// Layer o's LoRA adapters (LinearHooks over lora_forward / lora_backward).
  struct LayerLora;
  // ---- LoRA (lora.cpp) ----
  /// out += scale * (x A^T) B^T for linear t of layer o on `rows` rows (nothing if t is not adapted);
  /// x A^T is kept in a for backward. Reads the adapter block set by lora_use().
  void lora_forward(const Block& o, LayerActs& a, int t, kernels::Operand x, float* out, int rows);
  /// Its backward from dout: dA and dB into the adapter block's gradients, d(x) accumulated into dx.
  void lora_backward(const Block& o, LayerActs& a, int t, kernels::Operand x, const float* dout, float* dx, int rows);
  /// This rank's (input, output) widths of adapted linear t: the output split for qkv and fc, the input for proj and fc2.
  std::pair<int, int> lora_dims(int t) const;
  /// The adapter block of layer l for the next lora_forward/backward: params (and grads when
  /// `grads`) from the store; lora_done() releases it (and reports its gradient complete).
  void lora_use(ParamStore& store, int l, bool grads);
  void lora_done(ParamStore& store, int l, bool grads);
  /// The embedding's adapters (LoraConfig::embedding; nothing without them): the input side adds
  /// scale * A[token] B^T to the N rows of x; the head side adds scale * (x B) A^T to `rows` rows of
  /// logits, and its backward (dlogits in `logits`) adds to dx and the adapters' gradients; the
  /// input side's backward takes d(embedding output). Parameters: emb_lora_p_ (and _g_), set by the caller.
  void lora_embed_forward(const int32_t* tokens, float* x, int N);
  void lora_head(const float* x, float* logits, int rows, bool backward, float* dx);
  void lora_embed_backward(const int32_t* tokens, const float* dx, int B, int T);
  /// Under sequence parallelism: this rank's rows of d (N rows of C) gathered into the workspace's
  /// full buffer, which is returned; without it, d itself.
  const float* gather_rows(const float* d, int N);
  /// A row-parallel linear's bias: added on tensor-parallel rank 0 only, before the group's sum.
  const float* row_bias(const float* b) const { return tp_.rank() == 0 ? b : nullptr; }
  /// What the MoE layers need of the current pass, and a layer's residual-MoE dense MLP (its
  /// weights, activations of set `a`, and the workspace's scratch).
  Moe::Pass moe_pass() const;
  Moe::Dense moe_dense(const float* lp, const uint16_t* lp16, float* lg, const Block& o, LayerActs& a) const;
  /// Which activation set `a` is (one per layer, or one shared under recomputation).
  int act_set(const LayerActs& a) const;
  /// Dropout site `site` of layer l (-1: the embedding) for this micro-batch (T tokens per sample),
  /// p = 0 outside training; rows start at micro-batch row first_row.
  kernels::Dropout dropout_at(int l, kernels::DropoutSite site, int T, long long first_row = 0) const;
  /// Hidden dropout of the n local rows of a (this rank's rows of the) residual-stream buffer, in place.
  void hidden_dropout(float* x, int l, kernels::DropoutSite site, int B, int T);
  /// The gradient that reaches a dropped output from d (this rank's rows): d itself without dropout,
  /// else d with the site's mask applied, in the workspace.
  const float* hidden_dropout_grad(const float* d, int l, kernels::DropoutSite site, int B, int T);
  /// random-LTD: whether layer l drops tokens in this micro-batch of T tokens per sample.
  bool drops_tokens(int l, int T) const;
  /// Draws layer l's kept positions for the micro-batch (B samples of T tokens) into ltd_idx_[l].
  void choose_kept(int l, int B, int T);
  /// Rows of `full` (B*T rows of C) at layer l's kept positions into `sub` (B*kept rows), or back.
  void gather_kept(int l, const float* full, float* sub, int B) const;
  void scatter_kept(int l, const float* sub, float* full, int B) const;
  /// Layer l's kept rows of the micro-batch (b*T + position, B*kept of them), in backend memory.
  const int32_t* kept_rows(int l) const;
  /// Sequence parallelism: this rank's rows of an N-row stream gathered whole into `full` (returned);
  /// without it, `mine` itself.
  float* whole_stream(const float* mine, float* full, size_t N);
  /// The first row of this rank's part of the kept sub-batch; throws when its rows do not split.
  size_t kept_first_row(int B) const;
  /// Layer l over all B*T rows: layer_forward / layer_backward, or, when random-LTD drops tokens in
  /// it, the same on its kept rows with the dropped rows passed through. fresh: draw the positions
  /// (the forward pass); recomputation reuses them.
  void run_layer_forward(ParamStore& store, int l, const float* lp, LayerActs& a, const float* in, float* out, int B,
                         int T, bool fresh);
  void run_layer_backward(ParamStore& store, int l, const float* lp, float* lg, LayerActs& a, const float* in,
                          float* dres, int B, int T);
  /// Final norm (fp/fg: the final block) and the LM head (hw, its weight; hg, its gradient or null)
  /// + loss, chunked over rows. The token losses are read back later (head_loss).
  void head(kernels::Operand hw, float* hg, const float* fp, float* fg, const float* x, const int32_t* targets, int B,
            int T, float dloss, bool backward, float* dx);
  /// The sum of the last head()'s N token losses, in row order (as on every backend). On a device
  /// backend head() queued their download beside the ops that followed (the backward): this waits
  /// for it, not for those ops.
  double head_loss(int N);
  void settle_losses();  // a loss download still under way has finished (its buffer may go)
  /// The LM head's weight and (with grads) its gradient: the word embedding's (ep, the embedding
  /// block's parameters, held by the caller), or the untied output layer's, taken from the store;
  /// done_head releases the latter (and reports its gradient complete). The weight with its 16-bit
  /// copy where the store keeps one.
  std::pair<kernels::Operand, float*> use_head(ParamStore& store, const float* ep, bool grads);
  void done_head(ParamStore& store, bool grads);

  GptConfig cfg_;
  kernels::Precision precision_;
  bool recompute_;
  ParamLayout layout_;
  GptTensors tensors_;  // where each tensor lies in layout_
  const comm::Communicator* ep_ = nullptr;
  int ep_size_ = 1, ep_rank_ = 0;
  TensorParallel tp_;
  int Cl_ = 0, NHl_ = 0, Fl_ = 0;  // this tensor-parallel rank's attention channels, heads, MLP width
  int Vl_ = 0, vstart_ = 0;        // its rows of the padded vocabulary: [vstart_, vstart_ + Vl_)
  int head_rows_ = 256;            // rows of the LM head at once (OpsBackend::head_rows)
  Norm norm_;            // every norm
  Attention attention_;  // every layer's attention
  Mlp mlp_;              // the feed-forward of every dense layer, residual MoE and expert
  bool cac_ = false, replaying_ = false;
  bool training_ = false;  // forward_backward (noise, train capacity) vs forward_loss
  float dloss_ = 0;        // the current micro-batch's d(loss)/d(token loss)
  kernels::OpsBackend::Transfer loss_download_ = 0;  // head()'s losses on their way to host_losses
  bool loss_pending_ = false;
  int batch_rows_ = 0;     // B*T of the current micro-batch: the aux losses' weight (LTD layers see fewer rows)
  uint64_t drop_seed_ = 0;
  long long drop_first_ = 0;
  std::vector<int32_t> doc_start_, doc_pos_, ltd_start_, ltd_pos_;  // host: stage_documents, kept_key_start, kept_rotary_positions
  std::vector<std::vector<int32_t>> ltd_rows_;            // host: per layer, its kept rows (b*T + position)
  const int32_t* key_start_ = nullptr;  // backend memory: doc_start_ for this micro-batch, or nullptr
  const int32_t* positions_ = nullptr;  // backend memory: doc_pos_ for this micro-batch, or nullptr
  std::vector<int> ltd_layers_;
  std::vector<std::vector<int32_t>> ltd_idx_;  // per layer: (B, kept) positions of the last training micro-batch
  int ltd_kept_ = 0, ltd_B_ = 0;
  uint64_t ltd_seed_ = 0;
  long long ltd_first_ = 0;
  PhaseSeconds phase_;
  std::vector<Marks> marks_;
  const float* lora_p_ = nullptr;  // the current layer's adapters (lora_use), in the backend's memory
  float* lora_g_ = nullptr;
  int emb_lora_block_ = -1;        // the embedding's adapter block, or -1
  size_t emb_lora_a_ = 0, emb_lora_b_ = 0;  // its A (Vp, rank) and B (C, rank), offsets in the block
  const float* emb_lora_p_ = nullptr;
  float* emb_lora_g_ = nullptr;
  std::unique_ptr<kernels::OpsBackend> own_ops_;  // the CPU backend when none was given
  kernels::OpsBackend* ops_ = nullptr;
  std::unique_ptr<Workspace> ws_;                 // declared after ops_: its buffers go back to ops_ first
  std::unique_ptr<Moe> moe_;  // the feed-forward of every MoE layer (its routing state and counters)
};

}  // namespace hpct::model
