// Datasets of a run: mock tokens, prompt/response lines, or Megatron indexed datasets split by
// documents into train/valid (Megatron's --split; a unigram baseline judges what the model learned),
// blended by weight (--data-path w1 p1 w2 p2 ...), or given per split (--train/valid-data-path).
#include "hpct/engine/data/data.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "hpct/core/error.hpp"
#include "hpct/engine/checkpoint/hf_gpt2.hpp"
#include "hpct/io/blended_dataset.hpp"
#include "hpct/io/tokenizer.hpp"
#include "hpct/io/indexed_dataset.hpp"
#include "hpct/io/prompt_response_dataset.hpp"

namespace hpct::engine {

double unigram_perplexity(const io::IndexedDataset& ds, std::pair<size_t, size_t> train_docs,
                          std::pair<size_t, size_t> valid_docs, size_t vocab_size) {
  std::vector<double> counts(vocab_size, 1.0);  // add-one smoothing: unseen tokens keep a finite loss
  double total = (double)vocab_size;
  std::vector<int32_t> buf;
  auto for_each_token = [&](std::pair<size_t, size_t> docs, auto&& fn) {
    auto doc_idx = ds.doc_idx();
    auto sizes = ds.sizes();
    for (size_t d = docs.first; d < docs.second; ++d) {
      for (int64_t item = doc_idx[d]; item < doc_idx[d + 1]; ++item) {
        buf.resize(sizes[item]);
        ds.read(item, 0, sizes[item], buf.data());
        for (int32_t t : buf) fn(t);
      }
    }
  };
  for_each_token(train_docs, [&](int32_t t) {
    if (t >= 0 && (size_t)t < vocab_size) {
      counts[t] += 1;
      total += 1;
    }
  });
  double nll = 0, n = 0;
  for_each_token(valid_docs, [&](int32_t t) {
    if (t >= 0 && (size_t)t < vocab_size) {
      nll -= std::log(counts[t] / total);
      n += 1;
    }
  });
  return n > 0 ? std::exp(nll / n) : 0.0;
}

namespace {

// Prompt/response examples: JSON lines (FILE.jsonl) or a JSON array (Alpaca's alpaca_data.json).
bool is_jsonl(const std::string& p) {
  auto ends = [&](const char* s) { const size_t n = std::strlen(s); return p.size() > n && p.compare(p.size() - n, n, s) == 0; };
  return ends(".jsonl") || ends(".json");
}

// One split of Megatron's blend: each prefix's documents of `part` of --split (-1: all of them), a
// GptDataset of Megatron's ceil(w x samples x 1.005) samples each, blended by weight; one prefix
// is that dataset alone. nullptr where no dataset has documents in the part (no validation).
std::shared_ptr<io::TokenDataset> blend(const std::vector<std::string>& prefixes, const std::vector<double>& weights, int part,
                                        size_t samples, const TrainConfig& cfg, const char* flag, const char* what, bool verbose) {
  const size_t T = cfg.model.max_seq_length;
  const std::vector<double> w = weights.empty() ? std::vector<double>(prefixes.size(), 1.0) : weights;
  struct Source {
    std::shared_ptr<io::IndexedDataset> ds;
    std::pair<size_t, size_t> docs;
    double weight;
  };
  std::vector<Source> src;
  std::string report;
  for (size_t k = 0; k < prefixes.size(); ++k) {
    auto ds = std::make_shared<io::IndexedDataset>(io::IndexedDataset::open(prefixes[k]));
    std::pair<size_t, size_t> docs{0, ds->num_documents()};
    if (part >= 0) docs = io::split_document_ranges(cfg.split, ds->num_documents())[(size_t)part];
    if (docs.second <= docs.first) {
      if (part == 0)
        throw config_error(flag, "the split '" + cfg.split + "' leaves " + prefixes[k] + " no training documents");
      continue;  // Megatron skips a dataset without documents in a split
    }
    src.push_back({ds, docs, w[k]});
    char buf[96];
    std::snprintf(buf, sizeof buf, " (weight %.4g, docs [%zu, %zu))", w[k], docs.first, docs.second);
    report += (report.empty() ? "" : ", ") + prefixes[k] + buf;
  }
  std::vector<double> kept;
  for (const auto& x : src) kept.push_back(x.weight);
  const std::vector<size_t> need = io::BlendedDataset::samples_needed(kept, samples);
  std::vector<std::shared_ptr<const io::TokenDataset>> parts;
  for (size_t k = 0; k < src.size(); ++k)
    parts.push_back(std::make_shared<io::GptDataset>(src[k].ds, src[k].docs, src.size() == 1 ? samples : need[k], T, cfg.seed));
  if (parts.empty()) return nullptr;
  if (verbose)
    std::printf("> %s data: %s%s\n", what, report.c_str(),
                parts.size() > 1 ? (", blended as Megatron's BlendableDataset over " + std::to_string(samples) + " samples").c_str() : "");
  if (parts.size() == 1) return std::const_pointer_cast<io::TokenDataset>(parts[0]);
  return std::make_shared<io::BlendedDataset>(parts, kept, samples);
}

}  // namespace

static TrainData build_datasets(TrainConfig& cfg, int dp, bool verbose) {
  TrainData out;
  const size_t T = cfg.model.max_seq_length;
  if (cfg.mock_data) {
    for (auto [on, flag] : {std::pair{cfg.model.reset_attention_mask, "--reset-attention-mask"},
                            std::pair{cfg.model.reset_position_ids, "--reset-position-ids"},
                            std::pair{cfg.eod_mask_loss, "--eod-mask-loss"}, std::pair{cfg.pack_examples, "--pack-examples"}})
      if (on)
        throw config_error(flag, std::string(flag) + " works on documents that end at the tokenizer's end-of-document "
                                                     "token, and --mock-data has neither",
                           "train on a dataset (--data-path with --vocab-file and --merge-file)");
    out.train = std::make_shared<io::MockGptDataset>(cfg.model.vocab_size, T, cfg.seed);
    // a different stream for validation: the model is judged on samples it did not train on
    out.valid = std::make_shared<io::MockGptDataset>(cfg.model.vocab_size, T, cfg.seed + 1000003);
    return out;
  }
  const bool apart = !cfg.train_data_path.empty();  // --train-data-path: whole datasets per split
  if (cfg.data_path.size() > 1 || apart)
    for (const auto* v : {&cfg.data_path, &cfg.train_data_path, &cfg.valid_data_path})
      for (const auto& p : *v)
        if (is_jsonl(p))
          throw config_error(v == &cfg.data_path ? "--data-path" : v == &cfg.train_data_path ? "--train-data-path" : "--valid-data-path",
                             "prompt/response files (" + p + ") are not blended", "give one FILE.jsonl as --data-path");
  // Weights from a Hugging Face directory bring their tokenizer, unless one is given.
  if (!cfg.load_hf.empty() && cfg.tokenizer_type == "GPT2BPETokenizer" && cfg.vocab_file.empty() &&
      cfg.merge_file.empty() && cfg.tokenizer_model.empty())
    if (const auto s = directory_tokenizer(cfg.load_hf)) {
      cfg.tokenizer_type = s->type, cfg.vocab_file = s->vocab_file, cfg.merge_file = s->merge_file;
      cfg.tokenizer_model = s->model;
    }
  const auto tokenizer = io::open_tokenizer(cfg.tokenizer_spec());
  const io::Tokenizer& tok = *tokenizer;
  cfg.model.vocab_size = (int)tok.vocab_size();
  cfg.model.eod_token = tok.eod();
  if (verbose && cfg.tokenizer_type != "GPT2BPETokenizer")
    std::printf("> tokenizer %s: vocab %zu, end-of-document id %d%s\n", tok.describe().c_str(), tok.vocab_size(), tok.eod(),
                tok.document_prefix().empty() ? "" : (", " + std::to_string(tok.document_prefix().size()) + " id(s) before each document").c_str());
  const std::string& path = apart ? cfg.train_data_path[0] : cfg.data_path[0];
  const bool examples = !apart && cfg.data_path.size() == 1 && is_jsonl(path);
  if (cfg.pack_examples && !examples)
    throw config_error("--pack-examples", "--pack-examples packs prompt/response examples, and the training data is a "
                                          "token corpus (its samples already run across documents)",
                       "give --data-path FILE.jsonl, or drop --pack-examples (--reset-attention-mask and "
                       "--reset-position-ids keep a corpus's documents apart)");
  if (examples) {  // prompt/response examples
    if (cfg.pack_examples) {  // each example alone in its sample: its own attention and positions
      cfg.model.reset_attention_mask = cfg.model.reset_position_ids = true;
    }
    auto all = io::read_prompt_response(path, tok, cfg.prompt_key, cfg.response_key);
    const size_t n = all.size();
    auto r = io::split_document_ranges(cfg.split, n);
    if (r[0].second <= r[0].first)
      throw config_error("--split", "the split '" + cfg.split + "' leaves no training example of " + std::to_string(n));
    auto train = std::make_shared<io::PromptResponseDataset>(all, r[0].first, r[0].second, T, tok.eod(), cfg.seed,
                                                             cfg.pack_examples);
    std::shared_ptr<io::PromptResponseDataset> valid;
    if (r[1].second > r[1].first)
      valid = std::make_shared<io::PromptResponseDataset>(all, r[1].first, r[1].second, T, tok.eod(), cfg.seed,
                                                          cfg.pack_examples);
    if (verbose)
      std::printf("> prompt/response data %s: %zu examples ('%s' -> '%s', loss on the responses); train [%zu, %zu), "
                  "valid [%zu, %zu); %zu training examples longer than %zu tokens are cut\n",
                  path.c_str(), n, cfg.prompt_key.c_str(), cfg.response_key.c_str(), r[0].first, r[0].second, r[1].first,
                  r[1].second, train->truncated(), T + 1);
    // Training on no target trains nothing (loss 0, gradient 0): refused; some examples without one
    // are said with their count.
    if (train->target_tokens() == 0)
      throw config_error("--seq-length", path + ": none of the " + std::to_string(train->examples()) +
                                             " training examples keeps a response token within --seq-length " +
                                             std::to_string(T) + " (each prompt fills the sample, or prompt and response are empty)",
                         "raise --seq-length, or shorten the prompts");
    if (verbose && train->examples_without_targets() > 0)
      std::printf("> warning: %zu of %zu training examples keep no response token within --seq-length %zu (the prompt "
                  "fills the sample, or prompt and response are empty): they train nothing\n",
                  train->examples_without_targets(), train->examples(), T);
    if (valid && valid->target_tokens() == 0) {
      if (verbose)
        std::printf("> warning: none of the validation examples keeps a response token within --seq-length %zu: "
                    "no validation (its loss would be 0/0)\n", T);
      valid.reset();
    }
    out.valid = valid;
    if (verbose && cfg.pack_examples)
      std::printf("> packed %zu training examples into %zu samples of %zu tokens (%.1f%% of the tokens are examples'); "
                  "attention and positions per example\n",
                  train->examples(), train->size(), T + 1, 100.0 * train->fill());
    out.train = train;
    return out;
  }
  // Enough samples for every step (and the evaluations) without wrapping around.
  long long gb = cfg.global_batch > 0 ? cfg.global_batch : (long long)cfg.micro_batch * dp * std::max(1, cfg.grad_accum);
  const size_t train_samples = (size_t)std::max(1LL, cfg.train_samples > 0 ? cfg.train_samples : cfg.train_iters * gb);
  const size_t eval_samples = (size_t)std::max(1LL, (long long)cfg.eval_iters * gb);
  if (apart) {
    out.train = blend(cfg.train_data_path, cfg.train_data_weights, -1, train_samples, cfg, "--train-data-path", "training", verbose);
    if (!cfg.valid_data_path.empty())
      out.valid = blend(cfg.valid_data_path, cfg.valid_data_weights, -1, eval_samples, cfg, "--valid-data-path", "validation", verbose);
    return out;
  }
  if (cfg.data_path.size() > 1) {  // Megatron's blend, each dataset split by --split
    out.train = blend(cfg.data_path, cfg.data_weights, 0, train_samples, cfg, "--data-path", "training", verbose);
    out.valid = blend(cfg.data_path, cfg.data_weights, 1, eval_samples, cfg, "--data-path", "validation", verbose);
    return out;
  }
  auto ds = std::make_shared<io::IndexedDataset>(io::IndexedDataset::open(cfg.data_path[0]));
  auto ranges = io::split_document_ranges(cfg.split, ds->num_documents());
  if (ranges[0].second <= ranges[0].first)
    throw config_error("--split", "the split '" + cfg.split + "' leaves no training documents");
  out.train = std::make_shared<io::GptDataset>(ds, ranges[0], train_samples, T, cfg.seed);
  if (ranges[1].second > ranges[1].first) {
    out.valid = std::make_shared<io::GptDataset>(ds, ranges[1], eval_samples, T, cfg.seed);
    out.unigram_ppl = unigram_perplexity(*ds, ranges[0], ranges[1], tok.vocab_size());
  }
  if (verbose)
    std::printf("> dataset %s: %zu documents; train docs [%zu, %zu), valid docs [%zu, %zu)\n", cfg.data_path[0].c_str(),
                ds->num_documents(), ranges[0].first, ranges[0].second, ranges[1].first, ranges[1].second);
  return out;
}

TrainData build_train_data(TrainConfig& cfg, int dp, bool verbose) {
  TrainData out = build_datasets(cfg, dp, verbose);
  if (cfg.eod_mask_loss) {  // Megatron's: no loss where the input token is end-of-document
    out.train = std::make_shared<io::EodMaskedDataset>(out.train, cfg.model.eod_token);
    if (out.valid) out.valid = std::make_shared<io::EodMaskedDataset>(out.valid, cfg.model.eod_token);
  }
  return out;
}

}  // namespace hpct::engine
