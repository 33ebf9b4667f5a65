// Gpt2Tokenizer::from_hf_json: a Hugging Face tokenizer.json of byte-level BPE (Megatron's
// HFTokenizer; GPT-2, Llama 3) into the byte-level BPE tables (gpt2_tokenizer.hpp says what is
// followed and what is refused).
#include <algorithm>
#include <filesystem>
#include <functional>

#include "byte_level_bpe.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/file.hpp"
#include "hpct/io/gpt2_tokenizer.hpp"

namespace hpct::io {

namespace detail {
namespace {

std::string json_type(const nlohmann::json& j, const char* key = "type") {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string(j.dump());
}

// The pre-tokenizer's regex: ByteLevel's own (GPT-2's) or a Split regex before a regex-less ByteLevel.
std::string pre_tokenizer_pattern(const nlohmann::json& pre, const std::function<Error(const std::string&)>& refuse) {
  auto byte_level = [&](const nlohmann::json& b, bool regex) {
    if (b.value("add_prefix_space", false)) refuse("pre_tokenizer ByteLevel with add_prefix_space: true is not implemented");
    if (b.value("use_regex", true) != regex)
      refuse(regex ? "pre_tokenizer ByteLevel without its regex is implemented only after a Split"
                   : "pre_tokenizer ByteLevel after a Split must have use_regex: false");
  };
  if (json_type(pre) == "ByteLevel") {
    byte_level(pre, true);
    return kPattern;
  }
  if (json_type(pre) == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array() &&
      pre["pretokenizers"].size() == 2) {
    const auto& split = pre["pretokenizers"][0];
    const auto& bl = pre["pretokenizers"][1];
    if (json_type(split) == "Split" && json_type(bl) == "ByteLevel") {
      if (!split.contains("pattern") || !split["pattern"].is_object() || !split["pattern"].contains("Regex") ||
          !split["pattern"]["Regex"].is_string())
        refuse("pre_tokenizer Split with a pattern other than {\"Regex\": ...} is not implemented");
      if (split.value("behavior", std::string()) != "Isolated" || split.value("invert", false))
        refuse("pre_tokenizer Split with behavior '" + split.value("behavior", std::string("?")) +
               "' (or invert) is not implemented (only Isolated)");
      byte_level(bl, false);
      return split["pattern"]["Regex"].get<std::string>();
    }
  }
  refuse("pre_tokenizer " + json_type(pre) +
         " is not implemented (byte-level BPE: ByteLevel, or Split then ByteLevel; a SentencePiece-style file "
         "has tokenizer.model beside it for --tokenizer-type GPTSentencePieceTokenizer)");
  return {};
}

// The ids a TemplateProcessing post-processor puts before a single text; nothing after it.
void template_prefix(const nlohmann::json& post, std::vector<int32_t>& prefix,
                     const std::function<Error(const std::string&)>& refuse) {
  const std::string type = post.is_null() ? "null" : json_type(post);
  if (type == "null" || type == "ByteLevel") return;
  if (type == "Sequence" && post.contains("processors") && post["processors"].is_array()) {
    for (const auto& p : post["processors"]) template_prefix(p, prefix, refuse);
    return;
  }
  if (type != "TemplateProcessing" || !post.contains("single") || !post["single"].is_array())
    refuse("post_processor " + type + " is not implemented (TemplateProcessing, ByteLevel)");
  bool after = false;
  for (const auto& item : post["single"]) {
    if (item.contains("Sequence")) {
      after = true;
      continue;
    }
    const auto& st = item.contains("SpecialToken") ? item["SpecialToken"] : nlohmann::json();
    if (!st.is_object() || !st.contains("id") || !st["id"].is_string()) refuse("post_processor template item " + item.dump() + " is not understood");
    if (after) refuse("post_processor template adds '" + st["id"].get<std::string>() + "' after the text: not implemented");
    const auto& sp = post.contains("special_tokens") ? post["special_tokens"] : nlohmann::json();
    const std::string name = st["id"].get<std::string>();
    if (!sp.is_object() || !sp.contains(name) || !sp[name].contains("ids") || !sp[name]["ids"].is_array())
      refuse("post_processor template names '" + name + "', which its special_tokens do not define");
    for (const auto& id : sp[name]["ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxId)
        refuse("post_processor special token '" + name + "' has id " + id.dump());
      prefix.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
}

}  // namespace
}  // namespace detail

Gpt2Tokenizer Gpt2Tokenizer::from_hf_json(const std::string& path, const std::string& config_path) {
  // A key of an unexpected type (say "lstrip": "yes") makes nlohmann's accessors throw: one line
  // naming the file, as every other problem.
  try {
    return from_hf_json_checked(path, config_path);
  } catch (const nlohmann::json::exception& e) {
    throw file_error(path, std::string("unexpected JSON in a tokenizer file: ") + e.what(),
                     "Megatron's HFTokenizer reads a Hugging Face tokenizer.json of byte-level BPE (GPT-2, Llama 3)");
  }
}

Gpt2Tokenizer Gpt2Tokenizer::from_hf_json_checked(const std::string& path, const std::string& config_path) {
  using namespace detail;
  const char* hint = "Megatron's HFTokenizer reads a Hugging Face tokenizer.json of byte-level BPE (GPT-2, Llama 3)";
  std::function<Error(const std::string&)> refuse = [&](const std::string& why) -> Error {
    throw file_error(path, why, hint);
  };
  auto t = std::make_shared<Gpt2TokenizerTables>();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_regular_file(path, "tokenizer.json", kMaxTokenizerFileBytes, hint));
  } catch (const nlohmann::json::exception& e) {
    throw file_error(path, std::string("invalid JSON in tokenizer.json: ") + e.what(), hint);
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) refuse("has no \"model\" object");
  const auto& m = j["model"];
  if (json_type(m) != "BPE") refuse("model type " + json_type(m) + " is not byte-level BPE");
  if (j.contains("normalizer") && !j["normalizer"].is_null()) refuse("normalizer " + json_type(j["normalizer"]) + " is not implemented");
  if (m.value("byte_fallback", false)) refuse("model.byte_fallback: true (a SentencePiece-style BPE) is not implemented");
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"] != 0) refuse("model.dropout " + m["dropout"].dump() + " is not implemented");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && m[k] != "") refuse(std::string("model.") + k + " " + m[k].dump() + " is not implemented");
  if (j.contains("decoder") && !j["decoder"].is_null() && json_type(j["decoder"]) != "ByteLevel")
    refuse("decoder " + json_type(j["decoder"]) + " is not implemented (ByteLevel)");
  const std::string pattern = pre_tokenizer_pattern(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json(), refuse);
  template_prefix(j.contains("post_processor") ? j["post_processor"] : nlohmann::json(), t->prefix, refuse);
  t->ignore_merges = m.value("ignore_merges", false);

  if (!m.contains("vocab") || !m["vocab"].is_object() || m["vocab"].empty()) refuse("model.vocab must be a non-empty object");
  auto bytes_to_id = read_vocab(*t, m["vocab"], path, "tokenizer.json model.vocab");
  std::unordered_map<uint64_t, MergeTable::Merge> merges;
  if (!m.contains("merges") || !m["merges"].is_array()) refuse("model.merges must be a list");
  int32_t rank = 0;
  for (const auto& mg : m["merges"]) {
    auto malformed = [&](const std::string& what) {
      return file_error(path, "model.merges[" + std::to_string(rank) + "]: " + what, hint);
    };
    std::string left, right;
    if (mg.is_string()) {  // "a b" (tokenizers before 0.20)
      const std::string s = mg.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        throw malformed("expected two symbols separated by a space, got '" + s + "'");
      left = s.substr(0, sp), right = s.substr(sp + 1);
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {  // ["a", "b"]
      left = mg[0].get<std::string>(), right = mg[1].get<std::string>();
    } else {
      throw malformed("expected \"a b\" or [\"a\", \"b\"], got " + mg.dump());
    }
    add_merge(merges, bytes_to_id, left, right, rank++, malformed);
  }
  t->merges.build(merges);

  // Added tokens: ids of their own (or the vocab's), split out of the text before the pre-tokenizer.
  std::unordered_map<std::string, int32_t> added_ids;
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string() || !a.contains("id") ||
          !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() >= kMaxId)
        refuse("added_tokens entry " + a.dump() + " needs a string \"content\" and an id in [0, 2^26)");
      const std::string content = a["content"].get<std::string>();
      for (const char* k : {"lstrip", "rstrip", "single_word"})
        if (a.value(k, false)) refuse("added token '" + content + "' has " + k + ": true, which is not implemented");
      if (content.empty()) refuse("added_tokens has an empty token");
      const auto id = static_cast<int32_t>(a["id"].get<int64_t>());
      if (static_cast<size_t>(id) >= t->id_bytes.size()) {
        t->id_bytes.resize(static_cast<size_t>(id) + 1);
        t->id_present.resize(static_cast<size_t>(id) + 1, 0);
      }
      if (!t->id_present[id]) t->id_bytes[id] = content, t->id_present[id] = 1;
      added_ids[content] = id;
      t->added.emplace_back(content, id);
      t->added_first[static_cast<unsigned char>(content[0])] = 1;
    }
  std::sort(t->added.begin(), t->added.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  t->vocab_size = t->id_bytes.size();  // the largest id + 1: the model needs a row for each
  for (const int32_t id : t->prefix)
    if (static_cast<size_t>(id) >= t->vocab_size) refuse("post_processor template id " + std::to_string(id) + " is outside the vocab");
  if (t->ignore_merges) t->whole = bytes_to_id;
  bytes_to_id.clear();

  // The end-of-document id: tokenizer_config.json's eos_token, else a conventional name.
  auto id_of = [&](const std::string& token) -> int32_t {
    if (auto it = added_ids.find(token); it != added_ids.end()) return it->second;
    if (m["vocab"].contains(token) && m["vocab"][token].is_number_integer()) return m["vocab"][token].get<int32_t>();
    return -1;
  };
  std::string eos;
  if (!config_path.empty() && std::filesystem::exists(config_path)) {
    nlohmann::json c;
    try {
      c = nlohmann::json::parse(read_regular_file(config_path, "tokenizer_config.json", kMaxTokenizerFileBytes));
    } catch (const nlohmann::json::exception& e) {
      throw file_error(config_path, std::string("invalid JSON: ") + e.what());
    }
    if (c.is_object() && c.contains("eos_token")) {
      const auto& e = c["eos_token"];
      if (e.is_string()) eos = e.get<std::string>();
      else if (e.is_object() && e.contains("content") && e["content"].is_string()) eos = e["content"].get<std::string>();
    }
    if (!eos.empty() && (t->eod = id_of(eos)) < 0)
      throw file_error(config_path, "eos_token '" + eos + "' is not a token of " + path);
  }
  if (eos.empty())
    for (const char* name : {kEndOfText, "<|end_of_text|>", "</s>"})
      if ((t->eod = id_of(name)) >= 0) break;
  t->eod_missing = path + " names no end-of-document token (no eos_token in a tokenizer_config.json beside it, and no "
                          "<|endoftext|>, <|end_of_text|> or </s>)";
  compile_pre_tokenizer(*t, pattern, path);
  t->description = "HFTokenizer " + path;
  return Gpt2Tokenizer(std::move(t));
}

}  // namespace hpct::io
