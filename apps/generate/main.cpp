// generate — text from a trained GPT checkpoint: greedy, temperature, top-k, top-p, with a
// key/value cache (model/decoder.hpp) and several prompts decoded together.
//
//   generate --load checkpoints/gpt-tiny --prompt "The jury said" --max-new-tokens 40 --temperature 0
//
// The tokenizer is the run's (its --tokenizer-type and files, stored in the checkpoint), or given.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpct/comm/mpi.hpp"
#include "hpct/core/cli.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/file.hpp"
#include "hpct/core/report.hpp"
#include "hpct/core/units.hpp"
#include "hpct/engine/checkpoint/checkpoint_state.hpp"
#include "hpct/engine/checkpoint/checkpointer.hpp"
#include "hpct/engine/checkpoint/tokenizer_identity.hpp"
#include "hpct/engine/checkpoint/hf_gpt2.hpp"
#include "hpct/engine/config/preflight.hpp"
#include "hpct/io/tokenizer.hpp"
#include "hpct/kernels/backend.hpp"
#include "hpct/model/decoder.hpp"
#include "hpct/model/sampling.hpp"

using namespace hpct;

namespace {
const char* kHelp =
    "usage: generate (--load PATH | --load-hf PATH) (--prompt TEXT ... | --prompts-file FILE | --prompt-ids IDS)\n"
    "                [options]\n"
    "\n"
    "Continues each prompt with text from a pretrain_gpt or pretrain_moe checkpoint or GPT-2 weights in\n"
    "Hugging Face's layout, on the CPU (MoE layers route every token to its top-k experts).\n"
    "\n"
    "  --load PATH             a checkpoint file (iter_0000050.h5) or a --save directory (its `latest`)\n"
    "  --load-hf PATH          a save_pretrained GPT-2 directory (model.safetensors, config.json, and\n"
    "                          vocab.json + merges.txt for text prompts) or a .safetensors file; or a\n"
    "                          Llama directory (LlamaForCausalLM: one or several safetensors shards;\n"
    "                          its tokenizer.model, else tokenizer.json, for text prompts)\n"
    "  --prompt TEXT           a prompt (repeat for several)\n"
    "  --prompts-file FILE     one prompt per line (- : standard input)\n"
    "  --prompt-ids IDS        a prompt as comma-separated token ids (models trained on --mock-data)\n"
    "  --max-new-tokens N      tokens to generate per prompt (default 32); generation also stops at the\n"
    "                          end-of-document token and at the model's last position\n"
    "  --temperature T         0: greedy (the most likely token); default 1\n"
    "  --top-k K               keep the K most likely tokens (default 0: all)\n"
    "  --top-p P               keep the most likely tokens whose probability reaches P (default 1: all)\n"
    "  --seed S                sampling seed (default 1234); each prompt draws from its own stream, so\n"
    "                          its text does not depend on the batching\n"
    "  --micro-batch-size N    prompts decoded together (default 8)\n"
    "  --no-kv-cache           recompute every position for every new token (for comparisons)\n"
    "  --tokenizer-type T      as pretrain_gpt's (default: the checkpoint run's tokenizer), with\n"
    "  --tokenizer-model F     --tokenizer-model (SentencePiece, Hugging Face tokenizer.json) or\n"
    "  --vocab-file, --merge-file  the GPT-2 BPE files; files given must be the ones the run used\n"
    "  --num-samples N         samples per prompt, each from its own stream (default 1); with no\n"
    "                          prompt, N unconditional samples starting from the end-of-document token\n"
    "  --sample-output-file F, --genfile F\n"
    "                          every sample as a JSON line: prompt, text, ids, length, finished\n"
    "  Megatron's generate_text.sh spellings: --out-seq-length (= --max-new-tokens), --top_k, --top_p,\n"
    "  --sample-input-file (= --prompts-file), --recompute (= --no-kv-cache)\n"
    "  --json FILE             per prompt: its ids, the generated ids, each one's log-probability (the\n"
    "                          model's, temperature 1), the text and why it stopped; and the speeds\n"
    "  -h, --help              this text\n"
    "  --version               version and git commit\n"
    "@FILE stands for the flags written in FILE.\n";

struct Options {
  std::string load, load_hf, prompts_file, prompt_ids, vocab, merges, tokenizer_type, tokenizer_model, json;
  std::string sample_output;  // --sample-output-file / --genfile: JSON lines
  int num_samples = 1;
  bool num_samples_given = false;
  std::vector<std::string> prompts;
  int max_new = 32, batch = 8;
  uint64_t seed = 1234;
  bool cache = true, help = false;
  model::SamplingConfig sampling;
};

Options parse(int argc, char** argv) {
  Options o;
  cli::Parser p("generate");
  auto in = [](const std::string& f, const std::string& v, long long lo) { return cli::to_int(f, v, lo, INT_MAX); };
  p.flag("--load", 1, [&](const std::string& v) { o.load = v; });
  p.flag("--load-hf", 1, [&](const std::string& v) { o.load_hf = v; });
  p.flag("--prompt", 1, [&](const std::string& v) { o.prompts.push_back(v); });
  p.flag("--prompts-file,--sample-input-file", 1, [&](const std::string& v) { o.prompts_file = v; });
  p.flag("--num-samples", 1, [&](const std::string& v) { o.num_samples = (int)in("--num-samples", v, 1), o.num_samples_given = true; });
  p.flag("--sample-output-file,--genfile", 1, [&](const std::string& v) { o.sample_output = v; });
  p.flag("--prompt-ids", 1, [&](const std::string& v) { o.prompt_ids = v; });
  p.flag("--max-new-tokens,--out-seq-length", 1, [&](const std::string& v) { o.max_new = (int)in("--max-new-tokens", v, 1); });
  p.flag("--temperature", 1, [&](const std::string& v) { o.sampling.temperature = cli::to_double("--temperature", v); });
  p.flag("--top-k,--top_k", 1, [&](const std::string& v) { o.sampling.top_k = (int)in("--top-k", v, 0); });
  p.flag("--top-p,--top_p", 1, [&](const std::string& v) { o.sampling.top_p = cli::to_double("--top-p", v); });
  p.flag("--seed", 1, [&](const std::string& v) { o.seed = static_cast<uint64_t>(cli::to_int("--seed", v, 0)); });
  p.flag("--micro-batch-size", 1, [&](const std::string& v) { o.batch = (int)in("--micro-batch-size", v, 1); });
  p.flag("--no-kv-cache,--recompute", 0, [&](const std::string&) { o.cache = false; });
  p.flag("--vocab-file", 1, [&](const std::string& v) { o.vocab = v; });
  p.flag("--merge-file", 1, [&](const std::string& v) { o.merges = v; });
  p.flag("--tokenizer-type", 1, [&](const std::string& v) { o.tokenizer_type = v; });
  p.flag("--tokenizer-model", 1, [&](const std::string& v) { o.tokenizer_model = v; });
  p.flag("--json", 1, [&](const std::string& v) { o.json = v; });
  o.help = !p.parse(argc, argv);
  if (o.help) return o;
  if (o.load.empty() == o.load_hf.empty())
    throw config_error("--load", "give one of --load PATH (a checkpoint file or --save directory) and --load-hf PATH");
  o.sampling.validate();
  return o;
}

// The checkpoint's GPT (dense or MoE): its config (vocabulary padded), real vocabulary, tokenizer identity
// and the run's tokenizer files, and every parameter in layout order.
struct Loaded {
  model::GptConfig cfg;
  int vocab = 0;
  std::string file, tokenizer;
  std::optional<io::TokenizerSpec> spec;  // the run's tokenizer, where known
  std::vector<float> params;
};

Loaded load_hf(const std::string& path) {
  engine::HfGpt2 hf = engine::read_hf_gpt2(path);
  Loaded m;
  m.cfg = hf.cfg;
  m.vocab = hf.cfg.vocab_size;
  m.file = hf.file;
  m.tokenizer = hf.tokenizer ? "hf" : "unknown: Hugging Face weights without tokenizer files";
  m.spec = hf.tokenizer;
  m.params = std::move(hf.params);
  return m;
}

Loaded load(const std::string& path) {
  engine::CheckpointWeights w = engine::read_checkpoint_weights(path);
  Loaded m;
  m.cfg = w.cfg;
  m.file = w.file;
  const auto& c = w.stored.meta.config;
  m.vocab = m.cfg.vocab_size;
  if (c.contains("model") && c["model"].contains("vocab_size") && c["model"]["vocab_size"].is_number_integer())
    m.vocab = std::min<int>(m.vocab, c["model"]["vocab_size"].get<int>());
  m.tokenizer = w.stored.meta.tokenizer;
  m.spec = engine::stored_tokenizer_spec(c);
  m.params = std::move(w.params);
  return m;
}

struct Result {
  std::vector<int32_t> prompt, ids;
  std::vector<double> logprobs;
  std::string stop = "max_new_tokens";
};

}  // namespace

static int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.help) {
    std::cout << kHelp;
    return 0;
  }
  if (comm::Communicator::world().size() != 1)
    throw config_error("mpirun", "generate runs as one process: start it without mpirun -np N (N > 1)");
  engine::check_file_output(o.json, "--json");  // before the work, not found unwritable after it
  engine::check_file_output(o.sample_output, "--sample-output-file");
  kernels::BackendScope backend;
  Loaded m = o.load.empty() ? load_hf(o.load_hf) : load(o.load);

  // Prompts as ids; text through the run's tokenizer (checked against the checkpoint's identity).
  const bool mock = m.tokenizer.rfind("mock", 0) == 0;
  std::shared_ptr<const io::Tokenizer> tok;
  std::vector<std::string> texts = o.prompts;
  if (!o.prompts_file.empty()) {
    std::stringstream all;
    if (o.prompts_file == "-") all << std::cin.rdbuf();  // prompts piped in
    else all << read_regular_file(o.prompts_file, "--prompts-file", uint64_t(1) << 30);
    for (std::string line; std::getline(all, line);)
      if (!line.empty()) texts.push_back(line);
  }
  // Megatron's unconditional samples: no prompt, --num-samples N, each starting at end-of-document.
  const bool unconditional = texts.empty() && o.prompt_ids.empty() && (o.num_samples_given || !o.sample_output.empty());
  if (!texts.empty() || unconditional) {
    // The run's tokenizer, each file given on the command line instead of the stored one.
    io::TokenizerSpec s = m.spec.value_or(io::TokenizerSpec{});
    const bool given = !o.tokenizer_type.empty();
    if (given) s.type = o.tokenizer_type;
    if (!o.vocab.empty()) s.vocab_file = o.vocab;
    if (!o.merges.empty()) s.merge_file = o.merges;
    if (!o.tokenizer_model.empty()) s.model = o.tokenizer_model;
    const bool known = s.type == "GPT2BPETokenizer" ? !s.vocab_file.empty() && !s.merge_file.empty() : !s.model.empty();
    if (mock || (!m.spec && !given && o.vocab.empty()) || !known)
      throw config_error("--prompt", m.file + " was trained on " + (mock ? m.tokenizer : "unknown tokens"),
                         "give --prompt-ids, or the tokenizer (--vocab-file and --merge-file, or --tokenizer-type and "
                         "--tokenizer-model)");
    // The paths may come from the checkpoint's config: files the run was trained with, checked.
    const bool checkable = m.tokenizer.rfind("mock", 0) != 0 && m.tokenizer.rfind("unknown", 0) != 0;
    tok = checkable ? engine::open_checked_tokenizer(s, m.tokenizer, m.file) : io::open_tokenizer(s);
  }
  std::vector<Result> res;
  for (const auto& t : texts) {
    Result r;
    r.prompt = tok->document_prefix();  // Llama2Tokenizer's <s>, as Megatron's tokenize() gives it
    tok->encode_append(t, r.prompt);
    res.push_back(std::move(r));
  }
  if (unconditional) res.push_back({{tok->eod()}, {}, {}, {}});
  if (!o.prompt_ids.empty()) {
    Result r;
    std::stringstream ss(o.prompt_ids);
    for (std::string x; std::getline(ss, x, ',');) r.prompt.push_back(static_cast<int32_t>(cli::to_int("--prompt-ids", x, 0, INT_MAX)));
    res.push_back(r);
  }
  if (res.empty()) throw config_error("--prompt", "no prompt given", "use --prompt, --prompts-file or --prompt-ids");
  if (o.num_samples > 1) {  // each prompt's samples side by side, each with its own stream (its index)
    std::vector<Result> many;
    for (const auto& r : res)
      for (int k = 0; k < o.num_samples; ++k) many.push_back(r);
    res = std::move(many);
  }
  const int T = m.cfg.max_seq_length;
  for (size_t i = 0; i < res.size(); ++i) {
    if (res[i].prompt.empty()) throw config_error("--prompt", "prompt " + std::to_string(i) + " is empty");
    if ((int)res[i].prompt.size() >= T)
      throw config_error("--prompt", "prompt " + std::to_string(i) + " has " + std::to_string(res[i].prompt.size()) +
                                         " tokens; the model has " + std::to_string(T) + " positions (at most " +
                                         std::to_string(T - 1) + " leave room to generate)");
    for (int32_t id : res[i].prompt)
      if (id >= m.vocab) throw config_error("--prompt-ids", "token " + std::to_string(id) + " is not below the vocabulary " + std::to_string(m.vocab));
  }
  const int32_t eod = tok ? tok->eod() : -1;
  const int B = std::min<int>(o.batch, static_cast<int>(res.size())), Vp = m.cfg.padded_vocab();
  model::Decoder dec(m.cfg, m.params.data(), B);
  using clock = std::chrono::steady_clock;
  double prefill_s = 0, decode_s = 0;
  long long prefill_tokens = 0, new_tokens = 0;
  std::vector<float> logits((size_t)B * Vp);
  for (size_t g0 = 0; g0 < res.size(); g0 += B) {
    const int n = std::min<int>(B, static_cast<int>(res.size() - g0));
    std::vector<std::mt19937_64> rng;
    std::vector<int> live;  // sequences still generating
    std::vector<int32_t> next(n);
    auto t0 = clock::now();
    for (int s = 0; s < n; ++s) {
      Result& r = res[g0 + s];
      rng.emplace_back(o.seed * 0x9E3779B97F4A7C15ull + g0 + s);
      dec.clear(s);
      dec.extend(s, r.prompt.data(), (int)r.prompt.size(), logits.data() + (size_t)s * Vp);
      prefill_tokens += (long long)r.prompt.size();
      live.push_back(s);
    }
    auto t1 = clock::now();
    prefill_s += std::chrono::duration<double>(t1 - t0).count();
    while (!live.empty()) {
      std::vector<int> going;
      for (size_t i = 0; i < live.size(); ++i) {
        const int s = live[i];
        Result& r = res[g0 + s];
        double lp = 0;
        const int32_t id = model::sample_token(logits.data() + i * Vp, m.vocab, o.sampling, rng[s], &lp);
        r.ids.push_back(id);
        r.logprobs.push_back(lp);
        ++new_tokens;
        if (id == eod) r.stop = "eod";
        else if ((int)r.ids.size() >= o.max_new) r.stop = "max_new_tokens";
        else if (dec.length(s) >= T) r.stop = "length";
        else {
          going.push_back(s);
          next[going.size() - 1] = id;
        }
      }
      live = going;
      if (live.empty()) break;
      if (o.cache) {
        dec.step(live.data(), next.data(), (int)live.size(), logits.data());
      } else {  // every position again: the cost the cache saves
        for (size_t i = 0; i < live.size(); ++i) {
          const Result& r = res[g0 + live[i]];
          std::vector<int32_t> ctx = r.prompt;
          ctx.insert(ctx.end(), r.ids.begin(), r.ids.end());
          dec.clear(live[i]);
          dec.extend(live[i], ctx.data(), (int)ctx.size(), logits.data() + i * Vp);
        }
      }
    }
    decode_s += std::chrono::duration<double>(clock::now() - t1).count();
  }
  nlohmann::json out = nlohmann::json::array();
  std::string sample_lines;  // --sample-output-file: one JSON object per sample
  for (size_t i = 0; i < res.size(); ++i) {
    const Result& r = res[i];
    std::string text;
    if (tok) {
      std::vector<int32_t> shown = r.ids;
      if (!shown.empty() && shown.back() == eod) shown.pop_back();
      // The continuation as the whole text shows it: SentencePiece drops a leading space from a
      // text's first piece, so the generated ids are decoded after the prompt's, not alone.
      std::vector<int32_t> all = r.prompt;
      all.insert(all.end(), shown.begin(), shown.end());
      const std::string prompt = tok->decode(r.prompt), whole = tok->decode(all);
      text = whole.compare(0, prompt.size(), prompt) == 0 ? whole.substr(prompt.size()) : tok->decode(shown);
      std::cout << "----- " << i << " (" << r.ids.size() << " tokens, stop: " << r.stop << ")\n" << prompt << text << "\n";
    } else {
      std::cout << "----- " << i << " (" << r.ids.size() << " tokens, stop: " << r.stop << ")\n";
      for (int32_t id : r.ids) std::cout << id << " ";
      std::cout << "\n";
    }
    out.push_back({{"prompt_ids", r.prompt}, {"ids", r.ids}, {"logprobs", r.logprobs}, {"text", text}, {"stop", r.stop}});
    if (!o.sample_output.empty())  // Megatron's genfile fields (text, length, finished), with the prompt and ids
      sample_lines += nlohmann::json({{"prompt", tok ? tok->decode(r.prompt) : std::string()},
                                      {"text", text},
                                      {"ids", r.ids},
                                      {"length", r.ids.size()},
                                      {"finished", r.stop == "eod"}})
                          .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                      "\n";
  }
  if (!o.sample_output.empty()) {
    write_file_atomic(o.sample_output, sample_lines);
    std::printf("> %zu samples written to %s (JSON lines)\n", res.size(), o.sample_output.c_str());
  }
  const double tps = decode_s > 0 ? new_tokens / decode_s : 0, pps = prefill_s > 0 ? prefill_tokens / prefill_s : 0;
  std::printf("> generated %lld tokens for %zu prompts in %.2f s: %.1f tokens/s (%s), prompts read at %.1f tokens/s; "
              "cache %s\n",
              new_tokens, res.size(), prefill_s + decode_s, tps, o.cache ? "key/value cache" : "no cache, every position again",
              pps, format_bytes(double(dec.cache_bytes())).c_str());
  if (!o.json.empty())
    write_json_file(o.json, {{"app", "generate"}, {"checkpoint", m.file}, {"kv_cache", o.cache},
                             {"sampling", {{"temperature", o.sampling.temperature}, {"top_k", o.sampling.top_k},
                                           {"top_p", o.sampling.top_p}, {"seed", o.seed}}},
                             {"results", out}, {"generated_tokens", new_tokens}, {"tokens_per_second", tps},
                             {"prefill_tokens_per_second", pps}, {"seconds", prefill_s + decode_s},
                             {"cache_bytes", dec.cache_bytes()}});
  return 0;
}

int main(int argc, char** argv) {
  if (hpct::print_version_if_asked("generate", argc, argv)) return 0;
  comm::Environment env(&argc, &argv);
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "generate: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate: error: %s\n", e.what());
    return 1;
  }
}
