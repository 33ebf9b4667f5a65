// Supervised finetuning data (see prompt_response_dataset.hpp).
#include "hpct/io/prompt_response_dataset.hpp"

#include <algorithm>
#include <fstream>
#include <random>

#include "hpct/core/error.hpp"
#include "hpct/core/json_config.hpp"

namespace hpct::io {

std::vector<PromptResponseExample> read_prompt_response(const std::string& path, const Tokenizer& tok,
                                                        const std::string& prompt_key, const std::string& response_key) {
  std::ifstream in(path);
  if (!in) throw file_error(path, "cannot read (JSON lines with '" + prompt_key + "' and '" + response_key + "' fields)");
  std::vector<PromptResponseExample> out;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    const nlohmann::json j = parse_json(line, where);
    for (const auto& key : {prompt_key, response_key})
      if (!j.is_object() || !j.contains(key) || !j[key].is_string())
        throw file_error(where, "has no string field '" + key + "'",
                         "each line is a JSON object with '" + prompt_key + "' and '" + response_key +
                             "' (--prompt-key, --response-key)");
    PromptResponseExample e;
    e.ids = tok.document_prefix();
    tok.encode_append(j[prompt_key].get<std::string>(), e.ids);
    e.prompt = static_cast<int>(e.ids.size());
    tok.encode_append(j[response_key].get<std::string>(), e.ids);
    e.ids.push_back(tok.eod());
    out.push_back(std::move(e));
  }
  if (out.empty()) throw file_error(path, "holds no example");
  return out;
}

PromptResponseDataset::PromptResponseDataset(std::vector<PromptResponseExample> all, size_t begin, size_t end,
                                             size_t seq_length, int32_t eod, uint64_t seed, bool pack)
    : T_(seq_length), eod_(eod) {
  if (begin >= end || end > all.size() || seq_length == 0)
    throw Error("PromptResponseDataset: examples [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " +
                std::to_string(all.size()) + ", seq_length " + std::to_string(seq_length));
  ex_.assign(std::make_move_iterator(all.begin() + begin), std::make_move_iterator(all.begin() + end));
  order_.resize(ex_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
  std::mt19937_64 g(seed ^ 0x736674);  // Fisher-Yates with explicit draws: the same order everywhere
  for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[g() % i]);
  for (const auto& e : ex_) truncated_ += e.ids.size() > T_ + 1;
  first_.push_back(0);
  size_t used = 0;  // tokens in the sample being filled
  for (size_t k = 0; k < order_.size(); ++k) {
    const size_t n = ex_[order_[k]].ids.size();
    if (k > 0 && (!pack || used + n > T_ + 1)) first_.push_back(k), used = 0;
    used += n;
  }
  first_.push_back(order_.size());
  // What the loss masks will count, example by example (as get_loss_mask: targets from the
  // response's first token to the end-of-document, within the sample's T targets).
  for (size_t s = 0; s + 1 < first_.size(); ++s) {
    size_t at = 0;
    for (size_t k = first_[s]; k < first_[s + 1]; ++k) {
      const auto& e = ex_[order_[k]];
      const size_t from = at + std::max<size_t>(static_cast<size_t>(e.prompt), 1) - 1;
      const size_t to = std::min(T_, at + e.ids.size() - 1);
      const size_t kept = to > from ? to - from : 0;
      targets_ += kept;
      empty_ += kept == 0;
      at += e.ids.size();
    }
  }
}

double PromptResponseDataset::fill() const {
  size_t tokens = 0;
  for (const auto& e : ex_) tokens += std::min(e.ids.size(), T_ + 1);
  return (double)tokens / ((double)size() * (double)(T_ + 1));
}

void PromptResponseDataset::get(size_t i, int32_t* out) const {
  const size_t s = i % size();
  size_t at = 0;
  for (size_t k = first_[s]; k < first_[s + 1]; ++k) {
    const auto& ids = ex_[order_[k]].ids;
    const size_t n = std::min(ids.size(), T_ + 1 - at);  // cut only when alone and too long
    std::copy(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), out + at);
    at += n;
  }
  std::fill(out + at, out + T_ + 1, eod_);
}

void PromptResponseDataset::get_loss_mask(size_t i, uint8_t* out) const {
  const size_t s = i % size();
  std::fill(out, out + T_, 0);
  size_t at = 0;  // the example's first token
  for (size_t k = first_[s]; k < first_[s + 1]; ++k) {
    const auto& e = ex_[order_[k]];
    // target t is token t+1: it counts from the response's first token to the eod (never from the
    // previous example's last token, which an empty prompt would otherwise give)
    const size_t end = at + e.ids.size();
    for (size_t t = at + std::max<size_t>(static_cast<size_t>(e.prompt), 1) - 1; t < T_ && t + 1 < end; ++t) out[t] = 1;
    at += e.ids.size();
  }
}

}  // namespace hpct::io
