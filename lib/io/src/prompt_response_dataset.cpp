// Supervised finetuning data (see prompt_response_dataset.hpp).
#include "hpct/io/prompt_response_dataset.hpp"

#include <algorithm>
#include <fstream>
#include <random>

#include "hpct/core/error.hpp"
#include "hpct/core/file.hpp"
#include "hpct/core/json_config.hpp"

namespace hpct::io {

namespace {

// Stanford Alpaca's prompt template (its train.py PROMPT_DICT), with and without an input.
constexpr const char* kAlpacaWithInput =
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n### Input:\n{input}"
    "\n\n### Response:";
constexpr const char* kAlpacaNoInput =
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:";

std::string with_field(std::string t, const std::string& key, const std::string& value) {
  const std::string k = "{" + key + "}";
  const auto at = t.find(k);
  return at == std::string::npos ? t : t.replace(at, k.size(), value);
}

bool is_string_field(const nlohmann::json& j, const std::string& key) { return j.contains(key) && j[key].is_string(); }

// An example's prompt and response: its prompt_key and response_key strings, or an Alpaca record
// (instruction, optional input, output) in Alpaca's template. `where`: file:line or file[index].
void example_texts(const nlohmann::json& j, const std::string& where, const std::string& pk, const std::string& rk,
                   std::string& prompt, std::string& response) {
  const std::string hint = "each example is an object with '" + pk + "' and '" + rk +
                           "' (--prompt-key, --response-key), or Alpaca's 'instruction', 'input' and 'output'";
  if (!j.is_object()) throw file_error(where, "is not a JSON object", hint);
  if (!j.contains(pk) && j.contains("instruction")) {
    for (const char* k : {"instruction", "output"})
      if (!is_string_field(j, k)) throw file_error(where, "Alpaca record has no string field '" + std::string(k) + "'", hint);
    if (j.contains("input") && !j["input"].is_string()) throw file_error(where, "Alpaca record's 'input' is not a string", hint);
    const std::string input = j.value("input", std::string());
    prompt = with_field(input.empty() ? kAlpacaNoInput : with_field(kAlpacaWithInput, "input", input), "instruction",
                  j["instruction"].get<std::string>());
    response = j["output"].get<std::string>();
    return;
  }
  for (const auto& key : {pk, rk})
    if (!is_string_field(j, key)) throw file_error(where, "has no string field '" + key + "'", hint);
  prompt = j[pk].get<std::string>();
  response = j[rk].get<std::string>();
}

}  // namespace

std::vector<PromptResponseExample> read_prompt_response(const std::string& path, const Tokenizer& tok,
                                                        const std::string& prompt_key, const std::string& response_key) {
  const std::string text = read_regular_file(path, "prompt/response examples", uint64_t(16) << 30,
                                             "JSON lines with '" + prompt_key + "' and '" + response_key +
                                                 "', or a JSON array of them (Alpaca's alpaca_data.json)");
  std::vector<PromptResponseExample> out;
  auto add = [&](const nlohmann::json& j, const std::string& where) {
    std::string prompt, response;
    example_texts(j, where, prompt_key, response_key, prompt, response);
    PromptResponseExample e;
    e.ids = tok.document_prefix();
    tok.encode_append(prompt, e.ids);
    e.prompt = static_cast<int>(e.ids.size());
    tok.encode_append(response, e.ids);
    e.ids.push_back(tok.eod());
    out.push_back(std::move(e));
  };
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {  // one JSON array (alpaca_data.json)
    const nlohmann::json all = parse_json(text, path);
    if (!all.is_array()) throw file_error(path, "is not a JSON array of examples");
    for (size_t i = 0; i < all.size(); ++i) add(all[i], path + "[" + std::to_string(i) + "]");
  } else {  // JSON lines
    size_t n = 0;
    for (size_t pos = 0; pos < text.size();) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(pos, end - pos);
      pos = end + 1;
      ++n;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = path + ":" + std::to_string(n);
      add(parse_json(line, where), where);
    }
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
