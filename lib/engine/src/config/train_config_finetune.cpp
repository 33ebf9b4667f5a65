// Finetuning flags -> TrainConfig (see train_config.hpp): start from a model's weights, and
// prompt/response data (a --data-path ending in .jsonl, io/prompt_response_dataset.hpp).
#include <string>

#include "flag_parse.hpp"

namespace hpct::engine::detail {

void add_finetune_flags(FlagTable& t) {
  t.insert({
      {"--finetune", {false, [](TrainConfig& c, const std::string&) { c.finetune = true; }, "start from --load's weights only (Megatron's --finetune): iteration 0, fresh optimizer and schedule, any seed"}},
      {"--no-save-optim", {false, [](TrainConfig& c, const std::string&) { c.no_save_optim = true; }, "checkpoints without Adam's moments (a third of the size); resuming one needs --no-load-optim (fresh moments) or --finetune"}},
      {"--no-load-optim", {false, [](TrainConfig& c, const std::string&) { c.no_load_optim = true; }, "resume --load's run (weights, iteration, data position, schedule) with fresh Adam moments, bias correction and loss scale"}},
      {"--finetune-resume-optimizer", {false, [](TrainConfig& c, const std::string&) { c.finetune_resume_optimizer = true; }, "with --finetune: also take the checkpoint's optimizer states (Adam moments, step count, loss scale); iteration and schedule still start afresh"}},
      {"--load-hf", {true, [](TrainConfig& c, const std::string& v) { c.load_hf = v; }, "start from GPT-2 or Llama weights in Hugging Face's layout (a save_pretrained directory, or a GPT-2 .safetensors file); without tokenizer flags, the directory's own tokenizer is used"}},
      {"--prompt-key", {true, [](TrainConfig& c, const std::string& v) { c.prompt_key = v; }, "--data-path FILE.jsonl: the prompt's field (default prompt)"}},
      {"--pack-examples", {false, [](TrainConfig& c, const std::string&) { c.pack_examples = true; }, "--data-path FILE.jsonl: several examples per sample, each with its own attention and positions (sets --reset-attention-mask and --reset-position-ids)"}},
      {"--response-key", {true, [](TrainConfig& c, const std::string& v) { c.response_key = v; }, "--data-path FILE.jsonl: the response's field (default response); the loss is on the response only"}},
      {"--lora-rank", {true, [](TrainConfig& c, const std::string& v) { c.model.lora.rank = to_i32("--lora-rank", v, 0); }, "LoRA: train rank-r adapters on the linears of --lora-targets and freeze every base weight (0: off, the default)"}},
      {"--lora-alpha", {true, [](TrainConfig& c, const std::string& v) { c.model.lora.alpha = to_double("--lora-alpha", v); }, "LoRA: the adapters' update is scaled by alpha / rank (default: alpha = rank)"}},
      {"--lora-targets", {true, [](TrainConfig& c, const std::string& v) { c.model.lora.targets = model::LoraConfig::parse_targets(v); }, "LoRA: the linears adapted, comma-separated among qkv, proj, fc, fc2 (default all four)"}},
      {"--lora-modules-to-save", {true, [](TrainConfig& c, const std::string& v) { c.model.lora.modules_to_save = model::LoraConfig::parse_modules(v); }, "LoRA: base modules that also train, in full (PEFT's modules_to_save): final_layernorm, embedding (the tied word and position embeddings), position_embedding (the positions alone)"}},
      {"--eval-only", {false, [](TrainConfig& c, const std::string&) { c.skip_train = true; }, "the same as --skip-train: evaluate the loaded model on the validation split and exit"}},
  });
}

}  // namespace hpct::engine::detail
