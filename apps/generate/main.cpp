// generate — text from a trained GPT checkpoint: greedy, temperature, top-k, top-p, a repetition
// penalty, stop strings or beam search (model/generation.hpp), with a key/value cache and several
// prompts decoded together; from the command line, interactively, or as an HTTP server (server.hpp).
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
#include "hpct/engine/config/preflight.hpp"
#include "hpct/kernels/backend.hpp"
#include "hpct/model/generation.hpp"
#include "server.hpp"
#include "session.hpp"

using namespace hpct;
using generate::Session;

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
    "  --repetition-penalty R  divide the logits of ids already in the prompt or output by R (multiply\n"
    "                          where negative) before choosing; 1 (default): off; 1.2 is common\n"
    "  --stop TEXT             stop a sample once its text contains TEXT (repeat for several; the text\n"
    "                          keeps TEXT, as Hugging Face's stop_strings)\n"
    "  --beam-width W          beam search with W hypotheses (deterministic: no temperature, top-k or\n"
    "                          top-p); prints every finished hypothesis, best first, with its score\n"
    "  --length-penalty A      beam score = sum of log-probabilities / generated length^A (default 1)\n"
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
    "  --interactive           read prompts from standard input one line at a time, answering each\n"
    "                          before the next is read (\"stop\" or end of input ends)\n"
    "  --server                serve text generation over HTTP: PUT or POST JSON to /api with\n"
    "                          Megatron's fields (prompts, tokens_to_generate, temperature, top_k,\n"
    "                          top_p, logprobs, random_seed, add_BOS, stop_on_eol, stop_on_double_eol,\n"
    "                          beam_width, stop_token, length_penalty; also stop, repetition_penalty);\n"
    "                          answers {text, segments, logprobs | scores, tokens}; one request at a time\n"
    "  --host H, --port P      where the server listens (default 127.0.0.1:5000; port 0: any free one)\n"
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
  std::vector<std::string> stops;
  int batch = 8;
  bool help = false, interactive = false, server = false;
  std::string host = "127.0.0.1";
  int port = 5000;
  model::GenerationConfig gen;
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
  p.flag("--max-new-tokens,--out-seq-length", 1, [&](const std::string& v) { o.gen.max_new = (int)in("--max-new-tokens", v, 1); });
  p.flag("--temperature", 1, [&](const std::string& v) { o.gen.sampling.temperature = cli::to_double("--temperature", v); });
  p.flag("--top-k,--top_k", 1, [&](const std::string& v) { o.gen.sampling.top_k = (int)in("--top-k", v, 0); });
  p.flag("--top-p,--top_p", 1, [&](const std::string& v) { o.gen.sampling.top_p = cli::to_double("--top-p", v); });
  p.flag("--repetition-penalty", 1, [&](const std::string& v) { o.gen.repetition_penalty = cli::to_double("--repetition-penalty", v); });
  p.flag("--stop", 1, [&](const std::string& v) {
    if (v.empty()) throw config_error("--stop", "--stop needs a non-empty text");
    o.stops.push_back(v);
  });
  p.flag("--beam-width", 1, [&](const std::string& v) { o.gen.beam_width = (int)in("--beam-width", v, 1); });
  p.flag("--length-penalty", 1, [&](const std::string& v) { o.gen.length_penalty = cli::to_double("--length-penalty", v); });
  p.flag("--seed", 1, [&](const std::string& v) { o.gen.seed = static_cast<uint64_t>(cli::to_int("--seed", v, 0)); });
  p.flag("--micro-batch-size", 1, [&](const std::string& v) { o.batch = (int)in("--micro-batch-size", v, 1); });
  p.flag("--no-kv-cache,--recompute", 0, [&](const std::string&) { o.gen.cache = false; });
  p.flag("--interactive", 0, [&](const std::string&) { o.interactive = true; });
  p.flag("--server", 0, [&](const std::string&) { o.server = true; });
  p.flag("--host", 1, [&](const std::string& v) { o.host = v; });
  p.flag("--port", 1, [&](const std::string& v) { o.port = (int)cli::to_int("--port", v, 0, 65535); });
  p.flag("--vocab-file", 1, [&](const std::string& v) { o.vocab = v; });
  p.flag("--merge-file", 1, [&](const std::string& v) { o.merges = v; });
  p.flag("--tokenizer-type", 1, [&](const std::string& v) { o.tokenizer_type = v; });
  p.flag("--tokenizer-model", 1, [&](const std::string& v) { o.tokenizer_model = v; });
  p.flag("--json", 1, [&](const std::string& v) { o.json = v; });
  o.help = !p.parse(argc, argv);
  if (o.help) return o;
  if (o.load.empty() == o.load_hf.empty())
    throw config_error("--load", "give one of --load PATH (a checkpoint file or --save directory) and --load-hf PATH");
  o.gen.validate();
  if (o.server && o.interactive) throw config_error("--server", "--server and --interactive are two ways to run", "choose one");
  const bool given = !o.prompts.empty() || !o.prompts_file.empty() || !o.prompt_ids.empty();
  if ((o.server || o.interactive) && given)
    throw config_error(o.server ? "--server" : "--interactive", "prompts come from " + std::string(o.server ? "requests" : "standard input") +
                       " here", "drop --prompt, --prompts-file and --prompt-ids");
  return o;
}

// The prompts given on the command line (or piped in) as samples, num_samples of each, each with
// its own stream.
std::vector<model::Sample> command_line_samples(const Options& o, const Session& s, bool unconditional,
                                                const std::vector<std::string>& texts) {
  std::vector<model::Sample> res;
  for (const auto& t : texts) res.push_back({s.encode(t), {}, {}, {}, 0, 0});
  if (unconditional) res.push_back({{s.eod()}, {}, {}, {}, 0, 0});
  if (!o.prompt_ids.empty()) res.push_back({s.parse_ids(o.prompt_ids, "--prompt-ids"), {}, {}, {}, 0, 0});
  if (res.empty()) throw config_error("--prompt", "no prompt given", "use --prompt, --prompts-file or --prompt-ids");
  for (size_t i = 0; i < res.size(); ++i) s.check_prompt(res[i].prompt, i, o.prompt_ids.empty() ? "--prompt" : "--prompt-ids");
  std::vector<model::Sample> many;  // each prompt's samples side by side, each with its own stream (its index)
  for (const auto& r : res)
    for (int k = 0; k < o.num_samples; ++k) many.push_back(r);
  for (size_t i = 0; i < many.size(); ++i) many[i].stream = i;
  return many;
}

// Samples, or with --beam-width every prompt's finished hypotheses (best first), one after another.
std::vector<model::Sample> run_all(const Options& o, Session& s, std::vector<model::Sample> in, model::GenerationStats& st) {
  model::GenerationConfig c = o.gen;
  c.eod = s.eod();
  if (c.beam_width == 1) {
    st += s.generator().sample(in, c, s.stop_check(o.stops));
    return in;
  }
  std::vector<model::Sample> out;
  for (const auto& x : in)
    for (auto& h : s.generator().beam_search(x.prompt, c, &st)) out.push_back(std::move(h));
  return out;
}

void print_sample(const Session& s, size_t i, const model::Sample& r, bool beam) {
  std::cout << "----- " << i << " (" << r.ids.size() << " tokens, stop: " << r.stop;
  if (beam) std::cout << ", score " << r.score;
  std::cout << ")\n";
  if (s.has_tokenizer()) {
    std::cout << s.prompt_text(r) << s.continuation(r) << "\n";
  } else {
    for (int32_t id : r.ids) std::cout << id << " ";
    std::cout << "\n";
  }
  std::cout.flush();
}

// --interactive: one prompt per line of standard input, answered before the next line is read.
int interactive(const Options& o, Session& s) {
  model::GenerationStats st;
  size_t n = 0;
  std::string line;
  for (;;) {
    std::fprintf(stderr, "prompt (\"stop\" ends) >>> ");
    if (!std::getline(std::cin, line) || line == "stop") break;
    if (line.empty()) continue;
    std::vector<model::Sample> in;
    model::Sample x{s.encode(line), {}, {}, {}, 0, 0};
    s.check_prompt(x.prompt, n, "--interactive");
    for (int k = 0; k < o.num_samples; ++k) in.push_back(x), in.back().stream = n * o.num_samples + k;
    for (const auto& r : run_all(o, s, std::move(in), st)) print_sample(s, n++, r, o.gen.beam_width > 1);
  }
  std::printf("> interactive: %zu samples, %lld tokens generated\n", n, st.new_tokens);
  return 0;
}

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
  generate::Loaded m = o.load.empty() ? generate::load_hf(o.load_hf) : generate::load_checkpoint(o.load);

  std::vector<std::string> texts = o.prompts;
  if (!o.prompts_file.empty()) {
    std::stringstream all;
    if (o.prompts_file == "-") all << std::cin.rdbuf();  // prompts piped in
    else all << read_regular_file(o.prompts_file, "--prompts-file", uint64_t(1) << 30);
    for (std::string line; std::getline(all, line);)
      if (!line.empty()) texts.push_back(line);
  }
  // Megatron's unconditional samples: no prompt, --num-samples N, each starting at end-of-document.
  const bool unconditional = !o.server && !o.interactive && texts.empty() && o.prompt_ids.empty() &&
                             (o.num_samples_given || !o.sample_output.empty());
  const bool need_text = !texts.empty() || unconditional || o.server || o.interactive || !o.stops.empty();
  // Decoder slots (each a cache of every position): the batch, no larger than the work given, and
  // two per beam hypothesis.
  const size_t given = (texts.size() + (unconditional ? 1 : 0) + (o.prompt_ids.empty() ? 0 : 1)) * o.num_samples;
  const int batch = o.server || o.interactive ? o.batch : (int)std::min<size_t>(o.batch, std::max<size_t>(given, 1));
  const int slots = std::max(batch, 2 * o.gen.beam_width);
  Session s(std::move(m), {o.tokenizer_type, o.tokenizer_model, o.vocab, o.merges}, need_text, slots);

  if (o.server) {
    generate::ServerOptions so;
    so.host = o.host;
    so.port = o.port;
    so.defaults = o.gen;
    so.defaults.eod = s.eod();
    generate::serve(s, so);
    return 0;
  }
  if (o.interactive) return interactive(o, s);

  std::vector<model::Sample> in = command_line_samples(o, s, unconditional, texts);
  model::GenerationStats st;
  const size_t prompts = in.size();
  const std::vector<model::Sample> res = run_all(o, s, std::move(in), st);
  const bool beam = o.gen.beam_width > 1;
  nlohmann::json out = nlohmann::json::array();
  std::string sample_lines;  // --sample-output-file: one JSON object per sample
  for (size_t i = 0; i < res.size(); ++i) {
    const model::Sample& r = res[i];
    print_sample(s, i, r, beam);
    const std::string text = s.continuation(r);
    out.push_back({{"prompt_ids", r.prompt}, {"ids", r.ids}, {"logprobs", r.logprobs}, {"text", text}, {"stop", r.stop}});
    if (beam) out.back()["score"] = r.score;
    if (!o.sample_output.empty())  // Megatron's genfile fields (text, length, finished), with the prompt and ids
      sample_lines += nlohmann::json({{"prompt", s.prompt_text(r)},
                                      {"text", text},
                                      {"ids", r.ids},
                                      {"length", r.ids.size()},
                                      {"finished", r.stop == "eod" || r.stop == "stop_sequence"}})
                          .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                      "\n";
  }
  if (!o.sample_output.empty()) {
    write_file_atomic(o.sample_output, sample_lines);
    std::printf("> %zu samples written to %s (JSON lines)\n", res.size(), o.sample_output.c_str());
  }
  const double tps = st.decode_s > 0 ? st.new_tokens / st.decode_s : 0, pps = st.prefill_s > 0 ? st.prefill_tokens / st.prefill_s : 0;
  const size_t cache = s.generator().cache_bytes();
  std::printf("> generated %lld tokens for %zu prompts in %.2f s: %.1f tokens/s (%s%s), prompts read at %.1f tokens/s; "
              "cache %s\n",
              st.new_tokens, prompts, st.prefill_s + st.decode_s, tps, o.gen.cache ? "key/value cache" : "no cache, every position again",
              beam ? (", beam of " + std::to_string(o.gen.beam_width)).c_str() : "", pps, format_bytes(double(cache)).c_str());
  if (!o.json.empty())
    write_json_file(o.json, {{"app", "generate"}, {"checkpoint", s.model().file}, {"kv_cache", o.gen.cache},
                             {"sampling", {{"temperature", o.gen.sampling.temperature}, {"top_k", o.gen.sampling.top_k},
                                           {"top_p", o.gen.sampling.top_p}, {"seed", o.gen.seed},
                                           {"repetition_penalty", o.gen.repetition_penalty}, {"stop", o.stops},
                                           {"beam_width", o.gen.beam_width}, {"length_penalty", o.gen.length_penalty}}},
                             {"micro_batch_size", o.batch},
                             {"results", out}, {"generated_tokens", st.new_tokens}, {"tokens_per_second", tps},
                             {"prefill_tokens_per_second", pps}, {"seconds", st.prefill_s + st.decode_s},
                             {"cache_bytes", cache}});
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
