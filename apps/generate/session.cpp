// generate's loaded model, tokenizer and text helpers (see session.hpp).
#include "session.hpp"

#include <algorithm>
#include <climits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hpct/core/cli.hpp"
#include "hpct/core/error.hpp"
#include "hpct/engine/checkpoint/checkpoint_state.hpp"
#include "hpct/engine/checkpoint/hf_gpt2.hpp"
#include "hpct/engine/checkpoint/tokenizer_identity.hpp"

namespace hpct::generate {

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

Loaded load_checkpoint(const std::string& path) {
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

namespace {
// The run's tokenizer, each file given on the command line instead of the stored one; the paths
// may come from the checkpoint's config: files the run was trained with, checked.
std::shared_ptr<const io::Tokenizer> open_tokenizer(const Loaded& m, const TokenizerFlags& f) {
  const bool mock = m.tokenizer.rfind("mock", 0) == 0;
  io::TokenizerSpec s = m.spec.value_or(io::TokenizerSpec{});
  const bool given = !f.type.empty();
  if (given) s.type = f.type;
  if (!f.vocab.empty()) s.vocab_file = f.vocab;
  if (!f.merges.empty()) s.merge_file = f.merges;
  if (!f.model.empty()) s.model = f.model;
  const bool known = s.type == "GPT2BPETokenizer" ? !s.vocab_file.empty() && !s.merge_file.empty() : !s.model.empty();
  if (mock || (!m.spec && !given && f.vocab.empty()) || !known)
    throw config_error("--prompt", m.file + " was trained on " + (mock ? m.tokenizer : "unknown tokens"),
                       "give --prompt-ids, or the tokenizer (--vocab-file and --merge-file, or --tokenizer-type and "
                       "--tokenizer-model)");
  const bool checkable = !mock && m.tokenizer.rfind("unknown", 0) != 0;
  return checkable ? engine::open_checked_tokenizer(s, m.tokenizer, m.file) : io::open_tokenizer(s);
}
}  // namespace

Session::Session(Loaded m, const TokenizerFlags& flags, bool need_text, int slots)
    : m_(std::move(m)), tok_(need_text ? open_tokenizer(m_, flags) : nullptr), gen_(m_.cfg, m_.params.data(), m_.vocab, slots) {}

std::vector<int32_t> Session::encode(const std::string& text) const {
  std::vector<int32_t> ids = tok_->document_prefix();  // Llama2Tokenizer's <s>, as Megatron's tokenize() gives it
  tok_->encode_append(text, ids);
  return ids;
}

std::vector<int32_t> Session::parse_ids(const std::string& csv, const std::string& flag) const {
  std::vector<int32_t> ids;
  std::stringstream ss(csv);
  for (std::string x; std::getline(ss, x, ',');) ids.push_back(static_cast<int32_t>(cli::to_int(flag, x, 0, INT_MAX)));
  return ids;
}

void Session::check_prompt(const std::vector<int32_t>& ids, size_t index, const std::string& flag) const {
  const int T = m_.cfg.max_seq_length;
  const std::string which = "prompt " + std::to_string(index);
  if (ids.empty()) throw config_error(flag, which + " is empty");
  if ((int)ids.size() >= T)
    throw config_error(flag, which + " has " + std::to_string(ids.size()) + " tokens; the model has " + std::to_string(T) +
                                 " positions (at most " + std::to_string(T - 1) + " leave room to generate)");
  for (int32_t id : ids)
    if (id >= m_.vocab) throw config_error(flag, which + ": token " + std::to_string(id) + " is not below the vocabulary " + std::to_string(m_.vocab));
}

std::string Session::prompt_text(const model::Sample& s) const { return tok_ ? tok_->decode(s.prompt) : std::string(); }

std::string Session::continuation(const model::Sample& s) const {
  if (!tok_) return {};
  std::vector<int32_t> shown = s.ids;
  if (!shown.empty() && shown.back() == tok_->eod()) shown.pop_back();
  std::vector<int32_t> all = s.prompt;
  all.insert(all.end(), shown.begin(), shown.end());
  const std::string prompt = tok_->decode(s.prompt), whole = tok_->decode(all);
  return whole.compare(0, prompt.size(), prompt) == 0 ? whole.substr(prompt.size()) : tok_->decode(shown);
}

model::StopCheck Session::stop_check(const std::vector<std::string>& stops) const {
  if (stops.empty() || !tok_) return {};
  return [this, stops](const model::Sample& s) {
    const std::string text = continuation(s);
    return std::any_of(stops.begin(), stops.end(), [&](const std::string& t) { return text.find(t) != std::string::npos; });
  };
}

}  // namespace hpct::generate
