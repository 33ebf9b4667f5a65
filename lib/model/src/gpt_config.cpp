// GptConfig, MoeConfig and LoraConfig: validation (one line naming the flag) and descriptions;
// split from gpt.cpp. See gpt.hpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "hpct/core/error.hpp"
#include "hpct/model/gpt.hpp"

namespace hpct::model {

void GptConfig::validate() const {
  auto pos = [](int v, const char* key) {
    if (v <= 0) throw config_error(key, std::string(key) + " must be positive, got " + std::to_string(v));
  };
  pos(num_layers, "--num-layers");
  pos(hidden_size, "--hidden-size");
  pos(num_heads, "--num-attention-heads");
  pos(max_seq_length, "--seq-length");
  if (max_position_embeddings < 0 || positions() < max_seq_length)
    throw config_error("--max-position-embeddings", "--max-position-embeddings " + std::to_string(max_position_embeddings) +
                                                        " is smaller than --seq-length " + std::to_string(max_seq_length),
                       "give --max-position-embeddings >= --seq-length (the position table holds every position trained on)");
  pos(vocab_size, "--vocab-size");
  pos(vocab_multiple, "--make-vocab-size-divisible-by");
  pos(tensor_parallel, "--tensor-model-parallel-size");
  if ((long long)vocab_size + vocab_granule() - 1 > 2147483647LL)  // padded_vocab() must not overflow
    throw config_error("--make-vocab-size-divisible-by", "--vocab-size " + std::to_string(vocab_size) +
                                                              " padded to a multiple of " + std::to_string(vocab_granule()) +
                                                              " does not fit 32 bits");
  if (hidden_size % num_heads != 0)
    throw config_error("--num-attention-heads", "--hidden-size " + std::to_string(hidden_size) +
                                                    " is not divisible by --num-attention-heads " +
                                                    std::to_string(num_heads));
  if (ffn_hidden_size < 0 || ffn_hidden_size > (1 << 30) || hidden_size > (1 << 28))
    throw config_error(ffn_hidden_size < 0 || ffn_hidden_size > (1 << 30) ? "--ffn-hidden-size" : "--hidden-size",
                       "--ffn-hidden-size " + std::to_string(ffn_hidden_size) + " / --hidden-size " +
                           std::to_string(hidden_size) + " is out of range",
                       "give a positive --ffn-hidden-size (0 or none: 4 x --hidden-size)");
  if (ffn() <= 0)
    throw config_error("--ffn-hidden-size", "--swiglu's default MLP width, int(4 x " + std::to_string(hidden_size) +
                                                " x 2/3 / 64) x 64 (Megatron's), is 0",
                       "give --ffn-hidden-size");
  if (num_kv_heads < 0 || num_heads % kv_heads() != 0)
    throw config_error("--num-key-value-heads", "--num-key-value-heads " + std::to_string(num_kv_heads) +
                                                    " does not divide --num-attention-heads " + std::to_string(num_heads),
                       "give a count of key/value heads that divides the query heads");
  if (num_heads % tensor_parallel != 0)
    throw config_error("--tensor-model-parallel-size", "--num-attention-heads " + std::to_string(num_heads) +
                                                           " is not divisible by --tensor-model-parallel-size " +
                                                           std::to_string(tensor_parallel),
                       "each tensor-parallel rank computes whole heads: choose a size that divides the heads");
  if (kv_heads() % tensor_parallel != 0)  // (after the query heads: without grouping they are the same count)
    throw config_error("--num-key-value-heads", "--num-key-value-heads " + std::to_string(kv_heads()) +
                                                    " is not divisible by --tensor-model-parallel-size " +
                                                    std::to_string(tensor_parallel),
                       "each tensor-parallel rank computes whole key/value heads: choose a size that divides them");
  if (ffn() % tensor_parallel != 0)
    throw config_error("--ffn-hidden-size", "the MLP width " + std::to_string(ffn()) +
                                                " is not divisible by --tensor-model-parallel-size " +
                                                std::to_string(tensor_parallel),
                       "each tensor-parallel rank holds an equal part of every MLP: choose --ffn-hidden-size to divide");
  if (!(init_std > 0)) throw config_error("--init-method-std", "--init-method-std must be positive");
  if (rotary) {
    const int d = hidden_size / num_heads;
    if (!(rotary_percent > 0 && rotary_percent <= 1) || rotary_dims() < 2 || rotary_dims() % 2 != 0)
      throw config_error("--rotary-percent", "--rotary-percent " + std::to_string(rotary_percent) + " of the head size " +
                                                 std::to_string(d) + " gives " + std::to_string(rotary_dims()) +
                                                 " rotary channels; they must be an even number >= 2",
                         "choose --rotary-percent in (0, 1] so that head size x percent is even");
    if (!(rope_theta > 1) || !std::isfinite(rope_theta))
      throw config_error("--rope-theta", "--rope-theta must be a finite number above 1, got " + std::to_string(rope_theta));
    if (lora.enabled() && lora.saves(LoraConfig::position_embeddings))
      throw config_error("--lora-modules-to-save", "position_embedding has no table to train: this model's positions are rotary");
  }
  if (!(attention_dropout >= 0 && attention_dropout < 1))
    throw config_error("--attention-dropout", "--attention-dropout must be in [0, 1), got " + std::to_string(attention_dropout));
  if (!(hidden_dropout >= 0 && hidden_dropout < 1))
    throw config_error("--hidden-dropout", "--hidden-dropout must be in [0, 1), got " + std::to_string(hidden_dropout));
  if ((reset_attention_mask || reset_position_ids) && (eod_token < 0 || eod_token >= vocab_size))
    throw config_error(reset_attention_mask ? "--reset-attention-mask" : "--reset-position-ids",
                       "documents inside a sample end at the tokenizer's end-of-document token, which this run does not "
                       "have (eod " + std::to_string(eod_token) + ", vocabulary " + std::to_string(vocab_size) + ")",
                       "train on a dataset with --vocab-file and --merge-file (not --mock-data)");
  if (lora.enabled()) {
    if (lora.targets == 0 || lora.targets > 0x1F)
      throw config_error("--lora-targets", "--lora-targets must name at least one of qkv, proj, fc, fc2, embedding");
    if (!(lora.alpha >= 0) || !std::isfinite(lora.alpha))
      throw config_error("--lora-alpha", "--lora-alpha must be positive, got " + std::to_string(lora.alpha));
    if (moe.enabled(num_layers))
      throw config_error("--lora-rank", "LoRA adapts the dense GPT's linears; this model has MoE layers (--num-experts)");
    if (untie_embeddings && lora.adapts(LoraConfig::embedding))
      throw config_error("--lora-targets", "--lora-targets embedding adapts the word embedding that is also the output "
                                           "head; with --untie-embeddings-and-output-weights they are two tensors",
                         "drop embedding from --lora-targets");
  } else if (lora.rank < 0) {
    throw config_error("--lora-rank", "--lora-rank must not be negative, got " + std::to_string(lora.rank));
  }
  const auto& m = moe;
  if (m.expert_interval < 1)
    throw config_error("--expert-interval", "--expert-interval must be at least 1, got " + std::to_string(m.expert_interval));
  for (int e : m.num_experts)
    if (e < 1) throw config_error("--num-experts", "--num-experts entries must be at least 1, got " + std::to_string(e));
  const int nmoe = m.moe_layers(num_layers);
  if (m.num_experts.size() > 1 && static_cast<int>(m.num_experts.size()) != nmoe)
    throw config_error("--num-experts", "--num-experts lists " + std::to_string(m.num_experts.size()) +
                                            " counts but the model has " + std::to_string(nmoe) + " MoE layers (--num-layers " +
                                            std::to_string(num_layers) + " / --expert-interval " +
                                            std::to_string(m.expert_interval) + ")",
                       "give one count for every MoE layer, or a single count for all");
  if (!m.enabled(num_layers)) return;
  if (m.topk < 1 || m.topk > 2) throw config_error("--topk", "--topk must be 1 or 2, got " + std::to_string(m.topk));
  for (int l = 0; l < num_layers; ++l)
    if (int e = m.experts_of(l, num_layers); e > 0 && m.topk > e)
      throw config_error("--topk", "--topk " + std::to_string(m.topk) + " exceeds the " + std::to_string(e) +
                                       " experts of layer " + std::to_string(l + 1));
  if (!(m.train_capacity_factor > 0) || !std::isfinite(m.train_capacity_factor))
    throw config_error("--moe-train-capacity-factor", "--moe-train-capacity-factor must be positive");
  if (!(m.eval_capacity_factor > 0) || !std::isfinite(m.eval_capacity_factor))
    throw config_error("--moe-eval-capacity-factor", "--moe-eval-capacity-factor must be positive");
  if (m.min_capacity < 0) throw config_error("--moe-min-capacity", "--moe-min-capacity must not be negative");
  if (m.noisy_gate_policy != "None" && m.noisy_gate_policy != "Jitter" && m.noisy_gate_policy != "RSample")
    throw config_error("--moe-noisy-gate-policy", "--moe-noisy-gate-policy must be None, Jitter or RSample, got '" +
                                                      printable(m.noisy_gate_policy) + "'");
  if (!(m.loss_coeff >= 0) || !std::isfinite(m.loss_coeff))
    throw config_error("--moe-loss-coeff", "--moe-loss-coeff must be a non-negative number");
  if (!(m.z_loss_coeff >= 0) || !std::isfinite(m.z_loss_coeff))
    throw config_error("--moe-z-loss-coeff", "--moe-z-loss-coeff must be a non-negative number");
}

long long GptConfig::vocab_granule() const {
  return std::lcm((long long)std::max(1, vocab_multiple), (long long)std::max(1, tensor_parallel));
}

int GptConfig::padded_vocab() const {
  const long long g = vocab_granule();
  return static_cast<int>((vocab_size + g - 1) / g * g);
}

static std::string fmt_prob(double p) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", p);
  return b;
}

namespace {
unsigned parse_names(const char* flag, const std::string& list, const char* const* names, int n) {
  unsigned bits = 0;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string name = list.substr(at, comma - at);
    int t = 0;
    while (t < n && name != names[t]) ++t;
    if (t == n) {
      std::string all;
      for (int k = 0; k < n; ++k) all += (k ? ", " : "") + std::string(names[k]);
      throw config_error(flag, std::string(flag) + " has '" + name + "'; the choices are " + all,
                         "give a comma-separated list of them");
    }
    bits |= 1u << t;
    at = comma + 1;
  }
  return bits;
}

std::string name_list(unsigned bits, const char* const* names, int n) {
  std::string s;
  for (int t = 0; t < n; ++t)
    if (bits >> t & 1u) s += (s.empty() ? "" : ",") + std::string(names[t]);
  return s;
}
}  // namespace

unsigned LoraConfig::parse_targets(const std::string& list) { return parse_names("--lora-targets", list, kTargetNames, 5); }
unsigned LoraConfig::parse_modules(const std::string& list) {
  return parse_names("--lora-modules-to-save", list, kModuleNames, kModules);
}
std::string LoraConfig::target_list() const { return name_list(targets, kTargetNames, 5); }
std::string LoraConfig::module_list() const { return name_list(modules_to_save, kModuleNames, kModules); }

std::string GptConfig::describe() const {
  return "GPT: " + std::to_string(num_layers) + " layers, hidden " + std::to_string(hidden_size) + ", " +
         std::to_string(num_heads) + " heads" +
         (kv_heads() != num_heads ? " (" + std::to_string(kv_heads()) + " key/value heads)" : std::string()) + ", " +
         (ffn() != 4 * hidden_size ? "MLP width " + std::to_string(ffn()) + ", " : std::string()) +
         (normalization != NormKind::layernorm ? std::string(norm_name(normalization)) + ", " : std::string()) +
         (mlp == MlpKind::swiglu ? "SwiGLU, " : "") + (linear_bias ? "" : "no linear biases, ") +
         (untie_embeddings ? "untied output layer, " : "") +
         (rotary ? "rotary positions (" + std::to_string(rotary_dims()) + " channels, theta " + fmt_prob(rope_theta) + "), "
                 : std::string()) + "seq " +
         std::to_string(max_seq_length) +
         (positions() != max_seq_length ? " (" + std::to_string(positions()) + " positions)" : std::string()) + ", vocab " +
         std::to_string(vocab_size) + " (padded " + std::to_string(padded_vocab()) + ")" +
         (tensor_parallel > 1 ? ", tensor-parallel " + std::to_string(tensor_parallel) +
                                    (sequence_parallel ? " (sequence-parallel)" : "")
                              : std::string()) +
         (attention_dropout > 0 || hidden_dropout > 0
              ? ", dropout " + fmt_prob(attention_dropout) + " attention / " + fmt_prob(hidden_dropout) + " hidden"
              : std::string()) +
         (reset_attention_mask || reset_position_ids
              ? std::string(", per-document ") +
                    (reset_attention_mask && reset_position_ids ? "attention and positions"
                     : reset_attention_mask                     ? "attention"
                                                                : "positions") +
                    " (documents end at token " + std::to_string(eod_token) + ")"
              : std::string()) +
         (lora.enabled() ? ", LoRA rank " + std::to_string(lora.rank) + " alpha " + fmt_prob(lora.alpha > 0 ? lora.alpha : lora.rank) +
                               " on " + lora.target_list() +
                               (lora.modules_to_save ? " (training in full: " + lora.module_list() + ")" : std::string())
                         : std::string());
}

int MoeConfig::experts_of(int layer, int num_layers) const {
  if (num_experts.empty() || expert_interval <= 0) return 0;
  const int n = layer + 1;  // Megatron-DeepSpeed numbers layers from 1
  if (n % expert_interval != 0) return 0;
  const int i = num_experts.size() == 1 ? 0 : (n - 1) / expert_interval;
  if (i >= static_cast<int>(num_experts.size())) return 0;
  return num_experts[i] > 1 ? num_experts[i] : 0;
}

bool MoeConfig::enabled(int num_layers) const {
  for (int l = 0; l < num_layers; ++l)
    if (experts_of(l, num_layers) > 0) return true;
  return false;
}

}  // namespace hpct::model
