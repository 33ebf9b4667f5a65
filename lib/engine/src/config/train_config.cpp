// Megatron flags and ds_config.json -> TrainConfig, with errors that name the flag or key.
#include "hpct/engine/config/train_config.hpp"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <fstream>
#include <sstream>

#include "hpct/core/cli.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/json_config.hpp"
#include "flag_parse.hpp"

namespace hpct::engine {
namespace detail {

long long to_int(const std::string& flag, const std::string& v) { return cli::to_int(flag, v); }

// An int field: the value must fit, never wrap (--num-layers 4294967298 is not 2).
int to_i32(const std::string& flag, const std::string& v, long long min) {
  return static_cast<int>(cli::to_int(flag, v, min, INT_MAX));
}

long long to_int_min(const std::string& flag, const std::string& v, long long min) {
  const long long x = cli::to_int(flag, v);
  if (x < min) throw config_error(flag, flag + " " + v + " must be >= " + std::to_string(min));
  return x;
}

double to_double(const std::string& flag, const std::string& v) { return cli::to_double(flag, v); }

static LrStyle parse_style(const std::string& key, const std::string& v) {
  if (v == "constant") return LrStyle::constant;
  if (v == "linear") return LrStyle::linear;
  if (v == "cosine") return LrStyle::cosine;
  if (v == "inverse-square-root") return LrStyle::inverse_square_root;
  throw config_error(key, "unknown learning-rate decay style '" + v + "'", "use constant, linear, cosine or inverse-square-root");
}


// Megatron's data-path list: one prefix, or weight/prefix pairs (weights first).
static void parse_blend(const char* flag, const std::string& v, std::vector<std::string>& prefixes, std::vector<double>& weights) {
  std::vector<std::string> tok;
  std::istringstream is(v);
  for (std::string t; is >> t;) tok.push_back(t);
  prefixes.clear();
  weights.clear();
  if (tok.size() == 1) {
    prefixes = tok;
    return;
  }
  if (tok.empty() || tok.size() % 2 != 0)
    throw config_error(flag, std::string(flag) + " takes one prefix or weight/prefix pairs (W1 PREFIX1 W2 PREFIX2 ...), got " +
                                 std::to_string(tok.size()) + " values",
                       "e.g. " + std::string(flag) + " 0.7 data/a_text_document 0.3 data/b_text_document");
  for (size_t i = 0; i < tok.size(); i += 2) {
    const double w = to_double(flag, tok[i]);
    if (!(w > 0)) throw config_error(flag, std::string(flag) + " weight " + tok[i] + " of " + printable(tok[i + 1]) + " must be positive");
    weights.push_back(w);
    prefixes.push_back(tok[i + 1]);
  }
}

static std::vector<int> to_i32_list(const char* flag, const std::string& v) {
  std::vector<int> out;
  std::istringstream is(v);
  std::string tok;
  while (is >> tok) out.push_back(to_i32(flag, tok, 1));
  if (out.empty()) throw config_error(flag, std::string(flag) + " needs at least one value");
  return out;
}

}  // namespace detail

namespace {
using namespace detail;

const FlagTable& flag_table() {
  static const FlagTable t = [] {
  FlagTable t = {
      {"--num-layers", {true, [](TrainConfig& c, const std::string& v) { c.model.num_layers = to_i32("--num-layers", v); }, "transformer layers"}},
      {"--hidden-size", {true, [](TrainConfig& c, const std::string& v) { c.model.hidden_size = to_i32("--hidden-size", v); }, "hidden size"}},
      {"--num-attention-heads", {true, [](TrainConfig& c, const std::string& v) { c.model.num_heads = to_i32("--num-attention-heads", v); }, "attention heads"}},
      {"--ffn-hidden-size", {true, [](TrainConfig& c, const std::string& v) { c.model.ffn_hidden_size = to_i32("--ffn-hidden-size", v, 1); }, "the MLP's hidden width (default 4 x --hidden-size)"}},
      {"--swiglu", {false, [](TrainConfig& c, const std::string&) { c.model.mlp = model::MlpKind::swiglu; }, "SwiGLU MLPs (Llama's): silu(gate) * up, default width int(4h x 2/3 / 64) x 64"}},
      {"--disable-bias-linear", {false, [](TrainConfig& c, const std::string&) { c.model.linear_bias = false; }, "no bias on the attention's and the MLPs' linears (Llama's)"}},
      {"--untie-embeddings-and-output-weights", {false, [](TrainConfig& c, const std::string&) { c.model.untie_embeddings = true; }, "the LM head is a tensor of its own (output_layer.weight), not the word embedding"}},
      {"--use-rotary-position-embeddings", {false, [](TrainConfig& c, const std::string&) { c.model.rotary = true; }, "rotary positions (RoPE, Llama's) in every attention instead of a learned table"}},
      {"--position-embedding-type", {true, [](TrainConfig& c, const std::string& v) {
         if (v == "rope") c.model.rotary = true;
         else if (v == "learned_absolute") c.model.rotary = false;
         else throw config_error("--position-embedding-type", "--position-embedding-type is '" + printable(v) + "'; the choices are learned_absolute and rope");
       }, "learned_absolute (default) or rope"}},
      {"--rotary-percent", {true, [](TrainConfig& c, const std::string& v) { c.model.rotary_percent = to_double("--rotary-percent", v); }, "the share of each head's channels rotated (default 1.0)"}},
      {"--rope-theta,--rotary-base", {true, [](TrainConfig& c, const std::string& v) { c.model.rope_theta = to_double("--rope-theta", v); }, "rotary positions' base (default 10000)"}},
      {"--num-key-value-heads,--num-query-groups", {true, [](TrainConfig& c, const std::string& v) { c.model.num_kv_heads = to_i32("--num-key-value-heads", v, 1); }, "key/value heads shared by groups of query heads (grouped-query attention; default: one per head)"}},
      {"--group-query-attention", {false, [](TrainConfig&, const std::string&) {}, "grouped-query attention (Megatron-LM's switch; the count is --num-query-groups)"}},
      {"--normalization", {true, [](TrainConfig& c, const std::string& v) {
         if (v == "layernorm" || v == "LayerNorm") c.model.normalization = model::NormKind::layernorm;
         else if (v == "rmsnorm" || v == "RMSNorm") c.model.normalization = model::NormKind::rmsnorm;
         else throw config_error("--normalization", "--normalization is '" + printable(v) + "'; the choices are layernorm and rmsnorm");
       }, "layernorm (default) or rmsnorm: every norm of the model"}},
      {"--seq-length", {true, [](TrainConfig& c, const std::string& v) { c.model.max_seq_length = to_i32("--seq-length", v); }, "sequence length"}},
      {"--max-position-embeddings", {true, [](TrainConfig& c, const std::string& v) { c.model.max_position_embeddings = to_i32("--max-position-embeddings", v, 1); }, "position table rows (default: --seq-length)"}},
      {"--vocab-size", {true, [](TrainConfig& c, const std::string& v) { c.model.vocab_size = to_i32("--vocab-size", v); c.vocab_size_given = true; }, "vocabulary size for --mock-data"}},
      {"--make-vocab-size-divisible-by", {true, [](TrainConfig& c, const std::string& v) { c.model.vocab_multiple = to_i32("--make-vocab-size-divisible-by", v); }, "pad the vocabulary (default 128)"}},
      {"--attention-dropout", {true, [](TrainConfig& c, const std::string& v) { c.model.attention_dropout = to_double("--attention-dropout", v); }, "dropout on the attention probabilities in training (default 0.1)"}},
      {"--hidden-dropout", {true, [](TrainConfig& c, const std::string& v) { c.model.hidden_dropout = to_double("--hidden-dropout", v); }, "dropout on the embedding, attention and MLP outputs in training (default 0.1)"}},
      {"--init-method-std", {true, [](TrainConfig& c, const std::string& v) { c.model.init_std = to_double("--init-method-std", v); }, "weight init std (default 0.02)"}},
      {"--micro-batch-size", {true, [](TrainConfig& c, const std::string& v) { c.micro_batch = to_i32("--micro-batch-size", v, 1); }, "samples per rank per micro-step"}},
      {"--global-batch-size", {true, [](TrainConfig& c, const std::string& v) { c.global_batch = to_i32("--global-batch-size", v, 1); }, "samples per optimizer step"}},
      {"--train-iters", {true, [](TrainConfig& c, const std::string& v) { c.train_iters = to_i32("--train-iters", v, 1); }, "optimizer steps"}},
      {"--lr", {true, [](TrainConfig& c, const std::string& v) { c.lr = to_double("--lr", v); }, "peak learning rate"}},
      {"--min-lr", {true, [](TrainConfig& c, const std::string& v) { c.min_lr = to_double("--min-lr", v); }, "final learning rate"}},
      {"--lr-warmup-iters", {true, [](TrainConfig& c, const std::string& v) { c.lr_warmup_iters = to_int("--lr-warmup-iters", v); }, "linear warmup steps"}},
      {"--lr-decay-iters", {true, [](TrainConfig& c, const std::string& v) { c.lr_decay_iters = to_int("--lr-decay-iters", v); }, "decay steps (default --train-iters)"}},
      {"--lr-decay-style", {true, [](TrainConfig& c, const std::string& v) { c.lr_style = parse_style("--lr-decay-style", v); }, "constant|linear|cosine|inverse-square-root"}},
      {"--clip-grad", {true, [](TrainConfig& c, const std::string& v) { c.clip_grad = to_double("--clip-grad", v); }, "global grad-norm clip (0 = off)"}},
      {"--weight-decay", {true, [](TrainConfig& c, const std::string& v) { c.weight_decay = to_double("--weight-decay", v); }, "decoupled weight decay"}},
      {"--adam-beta1", {true, [](TrainConfig& c, const std::string& v) { c.beta1 = to_double("--adam-beta1", v); }, "Adam beta1"}},
      {"--adam-beta2", {true, [](TrainConfig& c, const std::string& v) { c.beta2 = to_double("--adam-beta2", v); }, "Adam beta2"}},
      {"--adam-eps", {true, [](TrainConfig& c, const std::string& v) { c.eps = to_double("--adam-eps", v); }, "Adam epsilon"}},
      {"--bf16", {false, [](TrainConfig& c, const std::string&) { c.precision = PrecisionMode::bf16; }, "bf16 mixed precision (fp32 master weights)"}},
      {"--fp16", {false, [](TrainConfig& c, const std::string&) { c.precision = PrecisionMode::fp16; }, "fp16 mixed precision with dynamic loss scaling"}},
      {"--loss-scale", {true, [](TrainConfig& c, const std::string& v) { c.loss_scale.static_scale = to_double("--loss-scale", v); }, "static loss scale (default dynamic)"}},
      {"--initial-loss-scale", {true, [](TrainConfig& c, const std::string& v) { const double x = to_double("--initial-loss-scale", v); if (!(x >= 1 && x <= 0x1p62)) throw config_error("--initial-loss-scale", "--initial-loss-scale must be in [1, 2^62], got " + v); c.loss_scale.initial_scale_power = (int)std::lround(std::log2(x)); }, "initial dynamic scale"}},
      {"--min-loss-scale", {true, [](TrainConfig& c, const std::string& v) { c.loss_scale.min_scale = to_double("--min-loss-scale", v); }, "floor of the dynamic scale"}},
      {"--loss-scale-window", {true, [](TrainConfig& c, const std::string& v) { c.loss_scale.window = to_i32("--loss-scale-window", v); }, "steps before raising the scale"}},
      {"--hysteresis", {true, [](TrainConfig& c, const std::string& v) { c.loss_scale.hysteresis = to_i32("--hysteresis", v); }, "overflows before lowering the scale"}},
      {"--checkpoint-activations", {false, [](TrainConfig& c, const std::string&) { c.recompute_activations = true; }, "recompute each layer in backward"}},
      {"--communication-aware-checkpointing", {false, [](TrainConfig& c, const std::string&) { c.communication_aware_checkpointing = true; }, "with --checkpoint-activations: keep what each layer's collectives produced (MoE all-to-alls, tensor-parallel sums) and replay the layer in backward without them (sequence parallelism's norm all-gathers still run; TED's CAC; CPU backend; the memory it holds is in the summary)"}},
      {"--device", {true, [](TrainConfig& c, const std::string& v) { c.device = v; }, "cpu (default) or cuda: the model on the node-local GPU with the ZeRO states and the optimizer step (GPU-resident), or those on the host with zero_optimization.offload_optimizer (ZeRO-Offload)"}},
      {"--attention-kernel", {true, [](TrainConfig& c, const std::string& v) { c.attention_kernel = v, c.attention_kernel_flag = "--attention-kernel " + v; }, "auto (default: cuDNN's fused attention on the GPU where it serves: bf16/fp16, head size a multiple of 8 up to 128; else the materialised softmax), fused (an error where it cannot serve) or plain"}},
      {"--zero-stage", {true, [](TrainConfig& c, const std::string& v) { c.zero.stage = to_i32("--zero-stage", v); }, "ZeRO stage: 0 replicated, 1 optimizer states, 2 + gradients, 3 + parameters partitioned"}},
      // Mixture of experts (Megatron-DeepSpeed's flags; docs/moe.md)
      {"--num-experts", {true, [](TrainConfig& c, const std::string& v) { c.model.moe.num_experts = to_i32_list("--num-experts", v); }, "experts per MoE layer: one count, or one per MoE layer (PR-MoE pyramid); 1 = dense", true}},
      {"--expert-interval", {true, [](TrainConfig& c, const std::string& v) { c.model.moe.expert_interval = to_i32("--expert-interval", v, 1); }, "MoE on every N-th layer (default 2: layers 2, 4, ...)"}},
      {"--topk", {true, [](TrainConfig& c, const std::string& v) { c.model.moe.topk = to_i32("--topk", v); }, "experts per token: 1 or 2"}},
      {"--mlp-type", {true, [](TrainConfig& c, const std::string& v) { if (v != "standard" && v != "residual") throw config_error("--mlp-type", "--mlp-type must be standard or residual, got '" + printable(v) + "'"); c.model.moe.residual = v == "residual"; }, "standard | residual (Residual-MoE: a dense MLP beside the experts)"}},
      {"--tensor-model-parallel-size", {true, [](TrainConfig& c, const std::string& v) { c.model.tensor_parallel = to_i32("--tensor-model-parallel-size", v, 1); }, "ranks each layer is split over (Megatron's tensor parallelism; neighbours first)"}},
      {"--reset-attention-mask", {false, [](TrainConfig& c, const std::string&) { c.model.reset_attention_mask = true; }, "documents packed in a sample attend only within themselves (each ends at an end-of-document token)"}},
      {"--reset-position-ids", {false, [](TrainConfig& c, const std::string&) { c.model.reset_position_ids = true; }, "positions restart at 0 after each end-of-document token"}},
      {"--eod-mask-loss", {false, [](TrainConfig& c, const std::string&) { c.eod_mask_loss = true; }, "no loss on the prediction that follows an end-of-document token (the next document's first token)"}},
      {"--sequence-parallel", {false, [](TrainConfig& c, const std::string&) { c.model.sequence_parallel = true; }, "with tensor parallelism: norms and residuals on 1/T of the tokens, all-gather/reduce-scatter for the all-reduces (a no-op at T=1)"}},
      {"--moe-expert-parallel-size", {true, [](TrainConfig& c, const std::string& v) { c.moe_ep = to_i32("--moe-expert-parallel-size", v, 1); }, "ranks that split each MoE layer's experts (tokens move by all-to-all)"}},
      {"--moe-train-capacity-factor", {true, [](TrainConfig& c, const std::string& v) { c.model.moe.train_capacity_factor = to_double("--moe-train-capacity-factor", v); }, "expert capacity factor in training (default 1.0)"}},
      {"--moe-eval-capacity-factor", {true, [](TrainConfig& c, const std::string& v) { c.model.moe.eval_capacity_factor = to_double("--moe-eval-capacity-factor", v); }, "expert capacity factor in evaluation (default 1.0)"}},
      {"--moe-min-capacity", {true, [](TrainConfig& c, const std::string& v) { c.model.moe.min_capacity = to_i32("--moe-min-capacity", v); }, "at least this many slots per expert (default 4)"}},
      {"--moe-loss-coeff", {true, [](TrainConfig& c, const std::string& v) { c.model.moe.loss_coeff = to_double("--moe-loss-coeff", v); }, "weight of the load-balancing loss (default 0.1)"}},
      {"--moe-z-loss-coeff", {true, [](TrainConfig& c, const std::string& v) { c.model.moe.z_loss_coeff = to_double("--moe-z-loss-coeff", v); }, "weight of the router z-loss (default 0: off; DeepSpeed has none)"}},
      {"--moe-noisy-gate-policy", {true, [](TrainConfig& c, const std::string& v) { c.model.moe.noisy_gate_policy = v; }, "None | Jitter | RSample (training only)"}},
      {"--enable-expert-tensor-parallelism", {false, [](TrainConfig& c, const std::string&) { c.model.moe.expert_tensor_parallel = true; }, "split every expert over the tensor-parallel group like the dense MLP (TED); default: each tensor-parallel rank holds its experts whole"}},
      {"--disable-duplicate-token-dropping", {false, [](TrainConfig& c, const std::string&) { c.model.moe.drop_duplicate_tokens = false; }, "TED: every tensor-parallel rank sends all its routed rows through the all-to-all (default: 1/T each, then an all-gather over the tensor-parallel group)"}},
      {"--disable-moe-token-dropping", {false, [](TrainConfig& c, const std::string&) { c.model.moe.drop_tokens = false; }, "no capacity limit: capacity = the largest expert load over the expert-parallel group"}},
      {"--disable-moe-top2-2nd-expert-sampling", {false, [](TrainConfig& c, const std::string&) { c.model.moe.second_expert_sampling = false; }, "top-2: the second expert is the second-largest logit"}},
      {"--disable-moe-rts", {false, [](TrainConfig& c, const std::string&) { c.model.moe.use_rts = false; }, "top-1: drop over-capacity tokens by position instead of Random Token Selection"}},
      {"--create-moe-param-group", {false, [](TrainConfig&, const std::string&) {}, "accepted for Megatron-DeepSpeed scripts (expert parameters always form their own ZeRO group)"}},
      {"--data-path", {true, [](TrainConfig& c, const std::string& v) { parse_blend("--data-path", v, c.data_path, c.data_weights); }, "indexed dataset prefix (.bin/.idx), a prompt/response FILE.jsonl, or a blend W1 PREFIX1 W2 PREFIX2 ... (Megatron's)", true}},
      {"--train-data-path", {true, [](TrainConfig& c, const std::string& v) { parse_blend("--train-data-path", v, c.train_data_path, c.train_data_weights); }, "training data apart (PREFIX or W1 PREFIX1 ...; whole documents, no --split)", true}},
      {"--valid-data-path", {true, [](TrainConfig& c, const std::string& v) { parse_blend("--valid-data-path", v, c.valid_data_path, c.valid_data_weights); }, "validation data apart (with --train-data-path)", true}},
      {"--test-data-path", {true, [](TrainConfig& c, const std::string& v) { parse_blend("--test-data-path", v, c.test_data_path, c.test_data_weights); c.notes.push_back("--test-data-path has no effect here: the test split is not evaluated"); }, "test data apart (accepted; the test split is not evaluated here)", true}},
      {"--tokenizer-type", {true, [](TrainConfig& c, const std::string& v) { c.tokenizer_type = v; }, "GPT2BPETokenizer (default; --vocab-file, --merge-file), GPTSentencePieceTokenizer, Llama2Tokenizer (<s> before each document), SentencePieceTokenizer (Megatron's added <EOD> ...), HFTokenizer (a byte-level BPE tokenizer.json); the last four read --tokenizer-model"}},
      {"--tokenizer-model", {true, [](TrainConfig& c, const std::string& v) { c.tokenizer_model = v; }, "SentencePiece .model file, or a Hugging Face tokenizer.json (or its folder) for HFTokenizer"}},
      {"--vocab-file", {true, [](TrainConfig& c, const std::string& v) { c.vocab_file = v; }, "GPT-2 vocab.json"}},
      {"--merge-file", {true, [](TrainConfig& c, const std::string& v) { c.merge_file = v; }, "GPT-2 merges.txt"}},
      {"--split", {true, [](TrainConfig& c, const std::string& v) { c.split = v; }, "train,valid,test weights (default 969,30,1)"}},
      {"--mock-data", {false, [](TrainConfig& c, const std::string&) { c.mock_data = true; }, "synthetic tokens in [0, --vocab-size) (both required)"}},
      {"--no-optimizer-overlap", {false, [](TrainConfig& c, const std::string&) { c.optimizer_overlap = false; }, "ZeRO-Offload on a GPU: the step waits for the host AdamW instead of running the next forward beside it (the same numbers either way)"}},
      {"--optimizer-threads", {true, [](TrainConfig& c, const std::string& v) { c.optimizer_threads = to_int_min("--optimizer-threads", v, 0); }, "threads of the host AdamW step (CPU training, ZeRO-Offload); 0: OMP_NUM_THREADS, else SLURM_CPUS_PER_TASK, else the CPUs the rank may use"}},
      {"--seed", {true, [](TrainConfig& c, const std::string& v) { c.seed = (unsigned long long)to_int_min("--seed", v, 0); }, "random seed"}},
      {"--log-interval", {true, [](TrainConfig& c, const std::string& v) { c.log_interval = to_i32("--log-interval", v); }, "iterations between log lines"}},
      {"--eval-interval", {true, [](TrainConfig& c, const std::string& v) { c.eval_interval = to_i32("--eval-interval", v); }, "iterations between evaluations"}},
      {"--eval-iters", {true, [](TrainConfig& c, const std::string& v) { c.eval_iters = to_i32("--eval-iters", v); }, "batches per evaluation"}},
      {"--metrics-file", {true, [](TrainConfig& c, const std::string& v) { c.metrics_file = v; }, "JSON-lines metrics file"}},
      {"--json", {true, [](TrainConfig& c, const std::string& v) { c.json_summary = v; }, "JSON summary file"}},
      {"--deepspeed_config", {true, [](TrainConfig& c, const std::string& v) { c.ds_config_path = v; }, "DeepSpeed ds_config.json"}},
      {"--save", {true, [](TrainConfig& c, const std::string& v) { c.save_dir = v; }, "checkpoint directory to save into"}},
      {"--load", {true, [](TrainConfig& c, const std::string& v) { c.load_path = v; }, "checkpoint directory (its latest) or file to resume from"}},
      {"--save-interval", {true, [](TrainConfig& c, const std::string& v) { c.save_interval = to_int("--save-interval", v); }, "iterations between checkpoints"}},
      {"--exit-interval", {true, [](TrainConfig& c, const std::string& v) { c.exit_interval = to_int("--exit-interval", v); }, "save and exit after this iteration"}},
      {"--keep-last", {true, [](TrainConfig& c, const std::string& v) { c.keep_last = to_i32("--keep-last", v); }, "keep only the newest K checkpoints (0: all)"}},
      {"--async-save", {false, [](TrainConfig& c, const std::string&) { c.async_save = true; }, "interval saves: copy the state to host memory and write it in the background while training goes on"}},
      {"--deepspeed", {false, [](TrainConfig&, const std::string&) {}, "accepted for Megatron-DeepSpeed scripts"}},
      // --estimate-memory and its cluster shape (docs/zero.md); a bad value names its flag.
      {"--estimate-memory", {false, [](TrainConfig& c, const std::string&) { c.estimate.enabled = true; }, "print memory per device/host/NVMe for ZeRO stages 0-3 and offloads, then exit"}},
      {"--estimate-nodes", {true, [](TrainConfig& c, const std::string& v) { c.estimate.nodes = to_i32("--estimate-nodes", v); if (c.estimate.nodes <= 0) throw config_error("--estimate-nodes", "--estimate-nodes must be positive, got " + v); }, "estimate: nodes (default 1)"}},
      {"--estimate-gpus-per-node", {true, [](TrainConfig& c, const std::string& v) { c.estimate.gpus_per_node = to_i32("--estimate-gpus-per-node", v); if (c.estimate.gpus_per_node <= 0) throw config_error("--estimate-gpus-per-node", "--estimate-gpus-per-node must be positive, got " + v); }, "estimate: devices (ranks) per node (default 2)"}},
      {"--estimate-gpu-memory", {true, [](TrainConfig& c, const std::string& v) { c.estimate.gpu_memory_gb = to_double("--estimate-gpu-memory", v); if (!(c.estimate.gpu_memory_gb >= 0)) throw config_error("--estimate-gpu-memory", "--estimate-gpu-memory must be >= 0 GB, got " + v); }, "estimate: GB per device (default 0: ranks are host processes)"}},
      {"--estimate-cpu-memory", {true, [](TrainConfig& c, const std::string& v) { c.estimate.cpu_memory_gb = to_double("--estimate-cpu-memory", v); if (!(c.estimate.cpu_memory_gb > 0)) throw config_error("--estimate-cpu-memory", "--estimate-cpu-memory must be positive GB, got " + v); }, "estimate: CPU GB per node (default: this machine's)"}},
      {"--estimate-nvme", {true, [](TrainConfig& c, const std::string& v) { c.estimate.nvme_gb = to_double("--estimate-nvme", v); if (!(c.estimate.nvme_gb >= 0)) throw config_error("--estimate-nvme", "--estimate-nvme must be >= 0 GB, got " + v); }, "estimate: NVMe GB per node (default: free disk here)"}},
  };
  add_run_record_flags(t);  // run records: TensorBoard, CSV, timers (train_config_records.cpp)
  add_data_efficiency_flags(t);  // curriculum switch, token-based schedule (train_config_data_efficiency.cpp)
  add_finetune_flags(t);         // starting from weights, prompt/response data (train_config_finetune.cpp)
  add_compat_flags(t);           // recipes' no-op flags, aliases, sample-based runs, refusals (train_config_compat.cpp)
  return t;
  }();
  return t;
}

}  // namespace

// The group a flag is listed under in --help: Megatron's argument groups (arguments.py), decided by
// the flag's name, first rule that matches; the rest are "other".
static const char* help_group(const std::string& f) {
  auto any = [&](std::initializer_list<const char*> parts) {
    for (const char* p : parts)
      if (f.find(p) != std::string::npos) return true;
    return false;
  };
  if (any({"--lora-"})) return "LoRA (finetuning)";
  if (any({"expert", "moe", "--topk", "--mlp-type", "duplicate-token"})) return "mixture of experts";
  if (any({"fusion"})) return "training";
  if (any({"pipeline"})) return "distributed";
  if (any({"data-efficiency", "random-ltd", "curriculum"})) return "data efficiency";
  if (any({"estimate"})) return "memory estimate";
  if (any({"tensorboard", "--log-", "timing-log", "--metrics-file", "--json", "profile", "wandb"})) return "logging";
  if (any({"--lr", "--min-lr", "opt_param-scheduler"})) return "learning rate";
  if (any({"fp16", "--bf16", "loss-scale", "hysteresis", "in-fp32", "query-key-layer-scaling"})) return "mixed precision";
  if (any({"--save", "--load", "--finetune", "--keep-last", "--async-save", "universal-checkpoint", "--exit-interval", "-rng", "load-optim", "save-optim"}))
    return "checkpointing";
  if (any({"--eval-", "--skip-train"})) return "validation";
  if (any({"dropout", "--weight-decay", "--clip-grad", "--adam-"})) return "regularization";
  if (any({"--init-method", "--seed"})) return "initialization";
  if (any({"--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size", "--num-key-value-heads", "--group-query-attention", "--normalization", "--swiglu", "--disable-bias-linear", "--untie-embeddings", "--seq-length", "rotary", "--rope-theta", "--position-embedding-type", "--max-position-embeddings",
           "--vocab-size", "--make-vocab-size", "rotary"}))
    return "network size";
  if (any({"parallel", "--distributed", "--deepspeed", "distributed-optimizer", "--deepscale", "--zero-stage", "DDP", "--device",
           "partition-activations", "--cpu-optimizer", "allreduce"}))
    return "distributed";
  if (any({"data", "--split", "--vocab-file", "--merge-file", "tokenizer", "--num-workers", "-idx-path", "-key", "--reset-",
           "eod-mask", "pack-examples"}))
    return "data and dataloader";
  if (any({"batch-size", "--train-", "--exit-", "checkpoint", "recompute", "--optimizer", "optimizer-overlap", "onebitadam", "fusion",
           "flash-attn", "attention-kernel", "softmax", "persist-layer-norm", "synchronize", "contigious"}))
    return "training";
  return "other";
}

// Every flag of the table into a parser that applies it to cfg (Megatron's argument groups for --help).
static void declare(cli::Parser& p, TrainConfig& cfg) {
  for (const auto& [name, spec] : flag_table()) {
    if (p.declared(name)) continue;  // the app's own flag of that name
    const std::string names = name == "--deepspeed_config" ? "--deepspeed_config,--deepspeed-config" : name;
    const FlagSpec* f = &spec;
    p.flag(names, spec.takes_value ? (spec.many ? -1 : 1) : 0, [f, &cfg](const std::string& v) { f->apply(cfg, v); },
           spec.help, help_group(name));
  }
}

static const char* kHint = "see --help; docs/compatibility.md lists the Megatron-DeepSpeed flags and what each does here";

std::string help_text(const std::string& prog) {
  std::ostringstream os;
  os << "usage: " << prog << " [flags]\n\nTrains a GPT model with data parallelism over MPI ranks.\n"
     << "Flags follow Megatron-DeepSpeed's pretrain_gpt.py; a ds_config.json may set the batch,\n"
     << "optimizer, scheduler, precision and clipping (see docs/configuration.md).\n";
  TrainConfig scratch;
  cli::Parser p(prog, kHint);
  declare(p, scratch);
  os << p.help({"network size", "regularization", "training", "initialization", "learning rate", "checkpointing",
                "mixed precision", "distributed", "validation", "data and dataloader", "logging", "mixture of experts",
                "data efficiency", "memory estimate", "other"});
  os << "\n  --help                            this text\n  --version                         version and git commit\n";
  return os.str();
}

// Megatron's --attention-dropout and --hidden-dropout default: recipes that never name them train with it.
constexpr double kMegatronDropout = 0.1;

bool parse_args(const std::vector<std::string>& raw_args, TrainConfig& cfg) {
  return parse_args(raw_args, cfg, [](cli::Parser&) {});
}

bool parse_args(const std::vector<std::string>& raw_args, TrainConfig& cfg,
                const std::function<void(cli::Parser&)>& app_flags) {
  cfg.model.attention_dropout = cfg.model.hidden_dropout = kMegatronDropout;
  // Every unknown, refused or malformed flag goes into one error (cli.hpp), so a recipe is fixed in
  // one round, not one flag per run.
  cli::Parser p("pretrain_gpt", kHint);
  app_flags(p);
  declare(p, cfg);
  if (!p.parse(raw_args)) return false;
  const std::vector<std::string>& given = p.given();
  if (std::count(given.begin(), given.end(), "--bf16") && std::count(given.begin(), given.end(), "--fp16"))
    throw config_error("--bf16", "--bf16 and --fp16 are both given", "give one of them");
  // Mock tokens have no tokenizer to size the vocabulary: 256 was taken silently (issue 47 item 15).
  if (cfg.mock_data && !cfg.vocab_size_given)
    throw config_error("--mock-data", "--mock-data needs --vocab-size V: the range of its random tokens",
                       "add --vocab-size (50257 for GPT-2's)");
  if (!cfg.ds_config_path.empty()) apply_ds_config(cfg.ds_config_path, cfg, given);
  if (cfg.distributed_optimizer) {  // Megatron's distributed optimizer is ZeRO-1's sharding (after the ds_config's stage)
    cfg.notes.push_back(cfg.zero.stage == 0
                            ? "--use-distributed-optimizer: ZeRO stage 1 (optimizer states sharded over the data-parallel group)"
                            : "--use-distributed-optimizer has no effect here: ZeRO stage " + std::to_string(cfg.zero.stage) +
                                  " already shards the optimizer states over the data-parallel group");
    cfg.zero.stage = std::max(cfg.zero.stage, 1);
  }
  if (cfg.attention_kernel == "fused" && cfg.device == "cpu")
    cfg.notes.push_back(cfg.attention_kernel_flag + " has no effect here: the CPU backend computes attention with its "
                        "materialised kernel (the fused one, cuDNN's, is the GPU's: --device cuda)");
  return true;
}

void TrainConfig::finalize(int dp) {
  model.validate();
  finalize_data_efficiency(*this);
  if (mock_data) {
    if (!data_path.empty() || !train_data_path.empty())
      throw config_error("--mock-data", "--mock-data and --data-path (or --train-data-path) are exclusive");
    if (tokenizer_type != "GPT2BPETokenizer") io::check_tokenizer_spec(tokenizer_spec());  // a typo is still refused
  } else if (!data_path.empty() && !train_data_path.empty()) {
    throw config_error("--train-data-path", "--data-path and --train-data-path both name the training data",
                       "give --data-path (split by --split), or --train-data-path with --valid-data-path");
  } else if (train_data_path.empty() && !valid_data_path.empty()) {
    throw config_error("--valid-data-path", "--valid-data-path goes with --train-data-path", "give --train-data-path too");
  } else if (data_path.empty() && train_data_path.empty()) {
    throw config_error("--data-path", "no training data", "give --data-path PREFIX (see preprocess_data) or --mock-data");
  } else {
    io::check_tokenizer_spec(tokenizer_spec());
  }
  // DeepSpeed's batch rule: train_batch = micro * grad_accum * dp; any two give the third.
  const std::string where = ds_config_path.empty() ? "" : " (with " + ds_config_path + ")";
  // Products of int fields in 64 bits: micro x dp x accumulation must itself fit the batch's int.
  if (double(std::max(micro_batch, 1)) * dp * std::max(grad_accum, 1) > INT_MAX)  // in double: the product itself cannot overflow
    throw config_error("--micro-batch-size", "--micro-batch-size x data-parallel size x gradient accumulation exceeds " +
                                                 std::to_string(INT_MAX) + where);
  if (micro_batch <= 0 && global_batch > 0 && grad_accum > 0) {
    if (global_batch % (grad_accum * dp)) throw config_error("--global-batch-size", "global batch " + std::to_string(global_batch) + " is not divisible by gradient_accumulation_steps*dp = " + std::to_string(grad_accum * dp) + where);
    micro_batch = global_batch / (grad_accum * dp);
  }
  if (micro_batch <= 0) throw config_error("--micro-batch-size", "--micro-batch-size must be given and positive" + where);
  if (global_batch <= 0) global_batch = micro_batch * dp * (grad_accum > 0 ? grad_accum : 1);
  if (global_batch % (micro_batch * dp) != 0)
    throw config_error("--global-batch-size", "--global-batch-size " + std::to_string(global_batch) +
                                                  " is not divisible by --micro-batch-size " + std::to_string(micro_batch) +
                                                  " x data-parallel size " + std::to_string(dp) + where,
                       "use a multiple of " + std::to_string(micro_batch * dp));
  int ga = global_batch / (micro_batch * dp);
  if (grad_accum > 0 && grad_accum != ga)
    throw config_error("gradient_accumulation_steps", "gradient_accumulation_steps " + std::to_string(grad_accum) +
                                                          " does not match train_batch_size / (micro * dp) = " + std::to_string(ga) + where);
  grad_accum = ga;
  BatchSchedule(global_batch, (long long)micro_batch * dp, rampup);  // checks --rampup-batch-size against the batch
  finalize_samples(*this, dp);  // --train-samples: train_iters from the global batch (and its ramp)
  if (skip_train && train_iters <= 0) train_iters = 1;  // evaluation only: the schedule is never stepped
  if (train_iters <= 0) throw config_error("--train-iters", "--train-iters must be positive", "give --train-iters N (or --train-samples N)");
  // Every number is checked here, after all flags and the ds_config are read, so no check depends
  // on the order flags are given in; !(x >= a) also refuses NaN (no flag or key gives inf or NaN).
  auto finite = [](double x) { return std::isfinite(x); };
  if (lr_style < LrStyle::ds_warmup && !(lr > 0 && finite(lr))) throw config_error("--lr", "--lr must be positive");
  if (!(min_lr >= 0 && finite(min_lr)) || (lr_style < LrStyle::ds_warmup && min_lr > lr))
    throw config_error("--min-lr", "--min-lr must be in [0, --lr]");
  if (lr_style >= LrStyle::ds_warmup) {
    if (!(ds_warmup_max_lr > 0 && finite(ds_warmup_max_lr)))
      throw config_error("scheduler.params.warmup_max_lr", "warmup_max_lr must be positive" + where);
    if (!(ds_warmup_min_lr >= 0 && ds_warmup_min_lr <= ds_warmup_max_lr))
      throw config_error("scheduler.params.warmup_min_lr", "warmup_min_lr must be in [0, warmup_max_lr]" + where);
    if (!(ds_warmup_min_ratio >= 0 && ds_warmup_min_ratio <= 1))
      throw config_error("scheduler.params.warmup_min_ratio", "warmup_min_ratio must be in [0, 1]" + where);
    if (!(ds_cos_min_ratio >= 0 && ds_cos_min_ratio <= 1))
      throw config_error("scheduler.params.cos_min_ratio", "cos_min_ratio must be in [0, 1]" + where);
  }
  if (lr_warmup_iters < 0) throw config_error("--lr-warmup-iters", "--lr-warmup-iters must be >= 0");
  if (lr_decay_iters < 0) throw config_error("--lr-decay-iters", "--lr-decay-iters must be >= 0 (0: --train-iters)");
  if (lr_decay_iters == 0) lr_decay_iters = train_iters;
  if (lr_warmup_fraction >= 0) {  // Megatron: warmup = fraction x decay, in the run's unit
    if (train_samples > 0) lr_warmup_samples = std::llround(lr_warmup_fraction * double(lr_decay_samples));
    else lr_warmup_iters = std::llround(lr_warmup_fraction * double(lr_decay_iters));
  }
  if (!(exit_duration_mins >= 0)) throw config_error("--exit-duration-in-mins", "--exit-duration-in-mins must be >= 0 (0: no limit)");
  if (!(beta1 >= 0 && beta1 < 1)) throw config_error("--adam-beta1", "--adam-beta1 must be in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) throw config_error("--adam-beta2", "--adam-beta2 must be in [0, 1)");
  if (!(eps > 0 && finite(eps))) throw config_error("--adam-eps", "--adam-eps must be positive");
  if (!(weight_decay >= 0 && finite(weight_decay))) throw config_error("--weight-decay", "--weight-decay must be >= 0");
  if (!(clip_grad >= 0 && finite(clip_grad))) throw config_error("--clip-grad", "--clip-grad must be >= 0 (0 disables clipping)");
  if (!(loss_scale.static_scale >= 0 && finite(loss_scale.static_scale)))
    throw config_error("--loss-scale", "--loss-scale must be positive (or 0 for a dynamic scale)");
  if (!(loss_scale.min_scale > 0 && finite(loss_scale.min_scale)))
    throw config_error("--min-loss-scale", "--min-loss-scale must be positive");
  if (loss_scale.initial_scale_power < 0 || loss_scale.initial_scale_power > 62)
    throw config_error("--initial-loss-scale", "the initial loss scale must be 2^0 to 2^62");
  if (log_interval <= 0) throw config_error("--log-interval", "--log-interval must be positive");
  if (eval_interval <= 0) throw config_error("--eval-interval", "--eval-interval must be positive");
  if (eval_iters < 0) throw config_error("--eval-iters", "--eval-iters must be >= 0");
  if (save_interval < 0) throw config_error("--save-interval", "--save-interval must be >= 0");
  if (save_interval > 0 && save_dir.empty()) throw config_error("--save-interval", "--save-interval needs --save DIR");
  if (exit_interval < 0) throw config_error("--exit-interval", "--exit-interval must be >= 0");
  if (keep_last < 0) throw config_error("--keep-last", "--keep-last must be >= 0");
  if (communication_aware_checkpointing && !recompute_activations)
    throw config_error("--communication-aware-checkpointing",
                       "--communication-aware-checkpointing keeps communication results for the recompute pass",
                       "add --checkpoint-activations");
  if (model.moe.expert_tensor_parallel && !model.moe.enabled(model.num_layers))
    throw config_error("--enable-expert-tensor-parallelism", "--enable-expert-tensor-parallelism needs MoE layers",
                       "give --num-experts");
  if (moe_ep < 1) throw config_error("--moe-expert-parallel-size", "--moe-expert-parallel-size must be at least 1");
  if (moe_ep > 1 && !model.moe.enabled(model.num_layers))
    throw config_error("--moe-expert-parallel-size", "--moe-expert-parallel-size " + std::to_string(moe_ep) + " needs MoE layers",
                       "give --num-experts");
  // Experts not divisible by EP: the model refuses it (model::Gpt), on every rank alike.
  if (zero.stage < 0 || zero.stage > 3) throw config_error("--zero-stage", "ZeRO stage must be 0, 1, 2 or 3");
  zero.validate();
  if (device != "cpu" && device != "cuda") throw config_error("--device", "'" + device + "' is not a device: use cpu or cuda");
  if (attention_kernel != "auto" && attention_kernel != "fused" && attention_kernel != "plain")
    throw config_error("--attention-kernel", "'" + attention_kernel + "' is not an attention kernel: use auto, fused or plain");

  if (precision == PrecisionMode::fp16 && loss_scale.static_scale == 0 &&
      (loss_scale.window <= 0 || loss_scale.hysteresis <= 0 || !(loss_scale.min_scale > 0)))
    throw config_error("fp16", "loss_scale_window, hysteresis and min_loss_scale must be positive");
  finalize_random_ltd(*this);  // after the batch sizes, which its block may repeat
}

nlohmann::json config_to_json(const TrainConfig& c) {
  const char* prec = c.precision == PrecisionMode::fp32 ? "fp32" : c.precision == PrecisionMode::bf16 ? "bf16" : "fp16";
  nlohmann::json j = {{"model",
           {{"num_layers", c.model.num_layers},
            {"hidden_size", c.model.hidden_size},
            {"num_attention_heads", c.model.num_heads},
            {"num_key_value_heads", c.model.kv_heads()},
            {"ffn_hidden_size", c.model.ffn()},
            {"normalization", model::norm_name(c.model.normalization)},
            {"swiglu", c.model.mlp == model::MlpKind::swiglu},
            {"add_bias_linear", c.model.linear_bias},
            {"untie_embeddings_and_output_weights", c.model.untie_embeddings},
            {"position_embedding_type", c.model.rotary ? "rope" : "learned_absolute"},
            {"rotary_percent", c.model.rotary_percent},
            {"rope_theta", c.model.rope_theta},
            {"seq_length", c.model.max_seq_length},
            {"max_position_embeddings", c.model.positions()},
            {"vocab_size", c.model.vocab_size},
            {"padded_vocab_size", c.model.padded_vocab()},
            {"init_method_std", c.model.init_std},
            {"attention_dropout", c.model.attention_dropout},
            {"hidden_dropout", c.model.hidden_dropout},
            {"reset_attention_mask", c.model.reset_attention_mask},
            {"reset_position_ids", c.model.reset_position_ids}}},
          {"eod_mask_loss", c.eod_mask_loss},
          {"pack_examples", c.pack_examples},
          {"tensor_model_parallel_size", c.model.tensor_parallel},
          {"sequence_parallel", c.model.sequence_parallel && c.model.tensor_parallel > 1},
          {"micro_batch_size", c.micro_batch},
          {"global_batch_size", c.global_batch},
          {"gradient_accumulation_steps", c.grad_accum},
          {"train_iters", c.train_iters},
          {"lr", c.lr},
          {"min_lr", c.min_lr},
          {"lr_warmup_iters", c.lr_warmup_iters},
          {"lr_warmup_tokens", c.lr_warmup_tokens},
          {"lr_decay_tokens", c.lr_decay_tokens},
          {"train_tokens", c.train_tokens},
          {"train_samples", c.train_samples},
          {"rampup_batch_size", c.rampup.on() ? nlohmann::json::array({c.rampup.start, c.rampup.increment, c.rampup.samples})
                                              : nlohmann::json(nullptr)},
          {"override_opt_param_scheduler", c.override_opt_param_scheduler},
          {"skip_train", c.skip_train},
          {"lr_warmup_samples", c.lr_warmup_samples},
          {"lr_decay_samples", c.lr_decay_samples},
          {"exit_duration_in_mins", c.exit_duration_mins},
          {"lr_decay_iters", c.lr_decay_iters},
          {"lr_style", static_cast<int>(c.lr_style)},
          {"adam_beta1", c.beta1},
          {"adam_beta2", c.beta2},
          {"adam_eps", c.eps},
          {"weight_decay", c.weight_decay},
          {"clip_grad", c.clip_grad},
          {"precision", prec},
          {"communication_data_type", c.zero.fp32_communication ? std::string("fp32") : std::string(prec)},
          {"loss_scale", {{"static", c.loss_scale.static_scale}, {"initial_power", c.loss_scale.initial_scale_power},
                          {"window", c.loss_scale.window}, {"hysteresis", c.loss_scale.hysteresis},
                          {"min", c.loss_scale.min_scale}}},
          {"recompute_activations", c.recompute_activations},
          {"communication_aware_checkpointing", c.communication_aware_checkpointing},
          {"device", c.device},
          {"attention_kernel", c.attention_kernel},
          {"optimizer_overlap", c.optimizer_overlap},
          {"zero_stage", c.zero.stage},
          {"zero_optimization", {{"stage", c.zero.stage},
                                 {"reduce_bucket_size", c.zero.reduce_bucket_size},
                                 {"overlap_comm", c.zero.overlap_comm},
                                 {"allgather_bucket_size", c.zero.allgather_bucket_size},
                                 {"stage3_prefetch_bucket_size", c.zero.prefetch_bucket_size},
                                 {"stage3_param_persistence_threshold", c.zero.param_persistence_threshold},
                                 {"stage3_max_live_parameters", c.zero.max_live_parameters}}},
          {"data_path", c.data_path},
          {"data_weights", c.data_weights},
          {"train_data_path", c.train_data_path},
          {"train_data_weights", c.train_data_weights},
          {"valid_data_path", c.valid_data_path},
          {"valid_data_weights", c.valid_data_weights},
          {"tokenizer_type", c.tokenizer_type},
          {"tokenizer_model", c.tokenizer_model},
          {"vocab_file", c.vocab_file},
          {"merge_file", c.merge_file},
          {"split", c.split},
          {"mock_data", c.mock_data},
          {"seed", c.seed},
          {"save", c.save_dir},
          {"load", c.load_path},
          {"save_interval", c.save_interval},
          {"keep_last", c.keep_last},
          {"async_save", c.async_save},
          {"deepspeed_config", c.ds_config_path},
          {"moe", {{"num_experts", c.model.moe.num_experts},
                   {"expert_interval", c.model.moe.expert_interval},
                   {"topk", c.model.moe.topk},
                   {"mlp_type", c.model.moe.residual ? "residual" : "standard"},
                   {"expert_parallel_size", c.moe_ep},
                   {"train_capacity_factor", c.model.moe.train_capacity_factor},
                   {"eval_capacity_factor", c.model.moe.eval_capacity_factor},
                   {"min_capacity", c.model.moe.min_capacity},
                   {"token_dropping", c.model.moe.drop_tokens},
                   {"duplicate_token_dropping", c.model.moe.drop_duplicate_tokens},
                   {"expert_tensor_parallelism", c.model.moe.expert_tensor_parallel},
                   {"rts", c.model.moe.use_rts},
                   {"top2_2nd_expert_sampling", c.model.moe.second_expert_sampling},
                   {"noisy_gate_policy", c.model.moe.noisy_gate_policy},
                   {"loss_coeff", c.model.moe.loss_coeff},
                   {"z_loss_coeff", c.model.moe.z_loss_coeff}}}};
  data_efficiency_json(c, j);  // curriculum, metric_curriculum, random_ltd
  return j;
}

std::string arguments_text(const TrainConfig& c) {
  // Megatron's names are flat: the model's keys go without their "model." prefix; other groups keep theirs.
  std::vector<std::pair<std::string, std::string>> rows;
  std::function<void(const nlohmann::json&, const std::string&)> walk = [&](const nlohmann::json& j, const std::string& at) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string key = at.empty() || at == "model" ? it.key() : at + "." + it.key();
      if (it.value().is_object()) walk(it.value(), key);
      else rows.emplace_back(key, it.value().is_string() ? it.value().get<std::string>() : it.value().dump());
    }
  };
  walk(config_to_json(c), "");
  auto lower = [](std::string s) {
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const auto& a, const auto& b) { return lower(a.first) < lower(b.first); });
  std::string out = "------------------------ arguments ------------------------\n";
  for (const auto& [k, v] : rows)
    out += "  " + k + " " + std::string(k.size() < 48 ? 48 - k.size() : 1, '.') + " " + (v.empty() ? "None" : v) + "\n";
  return out + "-------------------- end of arguments ---------------------\n";
}

}  // namespace hpct::engine
