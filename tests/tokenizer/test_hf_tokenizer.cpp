// test_hf_tokenizer.cpp — Hugging Face tokenizer.json files of byte-level BPE (Megatron's
// HFTokenizer) through Gpt2Tokenizer::from_hf_json and io::open_tokenizer.
//
// It is: GPT-2's tokenizer.json (written here from vocab.json + merges.txt as the tokenizers library
// lays it out, merges as strings and as pairs) giving GPT-2's reference ids (expected_ids.json);
// the added tokens split out of the text; Llama 3's pre-tokenizer (a Split regex: digits in threes)
// and ignore_merges on a hand-made vocab; the template prefix; eos from tokenizer_config.json; and
// one test per refusal, each naming the file and the key. It is not: a check against the
// `tokenizers` library itself (not installed here; the GPT-2 reference ids stand in for it).
// Like test_gpt2_tokenizer, it needs scripts/fetch_tokenizer.sh's files and fails without them.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpct/core/error.hpp"
#include "hpct/io/gpt2_tokenizer.hpp"
#include "tokenizer_test_dirs.hpp"
#include "hpct/io/tokenizer.hpp"

namespace fs = std::filesystem;
using hpct::io::Gpt2Tokenizer;
using nlohmann::json;

namespace {

using hpct::test::data_dir;
using hpct::test::source_dir;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const hpct::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Llama 3's pre-tokenizer regex, as its tokenizer.json writes it.
const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's tokenizer.json as the tokenizers library writes it (vocab, merges, ByteLevel).
json gpt2_json(bool pair_merges) {
  json vocab = json::parse(slurp(data_dir() / "gpt2-vocab.json"));
  json merges = json::array();
  std::istringstream in(slurp(data_dir() / "gpt2-merges.txt"));
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const auto sp = line.find(' ');
    if (pair_merges) merges.push_back({line.substr(0, sp), line.substr(sp + 1)});
    else merges.push_back(line);
  }
  return {{"version", "1.0"},
          {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"single_word", false}, {"lstrip", false},
                             {"rstrip", false}, {"normalized", true}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
          {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                     {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab},
                     {"merges", merges}}}};
}

// GPT-2's byte-level alphabet: the code point that stands for byte b, as UTF-8.
std::string byte_token(int b) {
  int n = 0, cp = -1;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
    const int c = printable ? x : 256 + n++;
    if (x == b) cp = c;
  }
  std::string s;
  if (cp < 0x80) s += char(cp);
  else s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
  return s;
}

// 256 byte tokens (ids 0..255), "ab" = 256 by the merge "a b", and "abc" = 257 with no merge
// that makes it: only ignore_merges can give it.
json tiny_json(bool ignore_merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_token(b)] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  return {{"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"ignore_merges", ignore_merges}, {"vocab", vocab}, {"merges", {"a b"}}}}};
}

class HfTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(data_dir() / "gpt2-vocab.json"))
        << "GPT-2 tokenizer files not found in " << data_dir() << ": run scripts/fetch_tokenizer.sh";
    dir_ = fs::temp_directory_path() /
           ("hpct_hftok_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const json& j) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << j.dump();
    return p.string();
  }
  Gpt2Tokenizer gpt2() const {
    return Gpt2Tokenizer::from_files((data_dir() / "gpt2-vocab.json").string(), (data_dir() / "gpt2-merges.txt").string());
  }
  fs::path dir_;
};

}  // namespace

TEST_F(HfTokenizer, Gpt2JsonGivesTheReferenceIds) {
  const json cases = json::parse(slurp(source_dir() / "tests" / "tokenizer" / "expected_ids.json")).at("cases");
  ASSERT_GE(cases.size(), 25u);
  for (bool pairs : {false, true}) {
    const auto tok = Gpt2Tokenizer::from_hf_json(write("tokenizer.json", gpt2_json(pairs)), "");
    EXPECT_EQ(tok.vocab_size(), 50257u);
    EXPECT_EQ(tok.eod(), 50256);  // <|endoftext|> without a tokenizer_config.json
    EXPECT_TRUE(tok.document_prefix().empty());  // GPT-2's post-processor adds nothing
    for (const auto& c : cases) {
      const std::string text = c.at("text").get<std::string>();
      if (contains(text, "<|endoftext|>")) continue;  // an added token here; ordinary text for encoder.py
      EXPECT_EQ(tok.encode(text), c.at("ids").get<std::vector<int32_t>>()) << (pairs ? "pair merges: " : "") << text;
      EXPECT_EQ(tok.decode(tok.encode(text)), text);
    }
  }
}

TEST_F(HfTokenizer, AddedTokensAreSplitOutOfTheText) {
  const auto tok = Gpt2Tokenizer::from_hf_json(write("tokenizer.json", gpt2_json(false)), "");
  const Gpt2Tokenizer ref = gpt2();
  std::vector<int32_t> want = ref.encode("Hello");
  want.push_back(50256);
  for (int32_t id : ref.encode(" world<|endoftext")) want.push_back(id);
  EXPECT_EQ(tok.encode("Hello<|endoftext|> world<|endoftext"), want);
  // From vocab.json + merges.txt (Megatron's GPT2BPETokenizer) the same text is ordinary characters.
  const std::vector<int32_t> plain = ref.encode("a<|endoftext|>");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);
}

TEST_F(HfTokenizer, Llama3SplitRegexTakesDigitsInThrees) {
  json j = gpt2_json(false);
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Regex}}}, {"behavior", "Isolated"}, {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  const auto tok = Gpt2Tokenizer::from_hf_json(write("tokenizer.json", j), "");
  const Gpt2Tokenizer ref = gpt2();
  std::vector<int32_t> want;
  for (const char* piece : {"123", "456", "7", " abc"})
    for (int32_t id : ref.encode(piece)) want.push_back(id);
  EXPECT_EQ(tok.encode("1234567 abc"), want);  // GPT-2's regex keeps " 1234567" as one piece
  EXPECT_NE(ref.encode("1234567 abc"), want);
}

TEST_F(HfTokenizer, IgnoreMergesTakesAWholeVocabPiece) {
  EXPECT_EQ(Gpt2Tokenizer::from_hf_json(write("a.json", tiny_json(false)), "").encode("abc"), (std::vector<int32_t>{256, 'c'}));
  EXPECT_EQ(Gpt2Tokenizer::from_hf_json(write("b.json", tiny_json(true)), "").encode("abc"), (std::vector<int32_t>{257}));
}

TEST_F(HfTokenizer, TemplatePrefixAndEosFromTheConfig) {
  json j = gpt2_json(false);
  j["added_tokens"].push_back({{"id", 50257}, {"content", "<|begin_of_text|>"}, {"special", true}});
  j["post_processor"] = json::parse(R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [50257], "tokens": ["<|begin_of_text|>"]}}}]})");
  const std::string path = write("tokenizer.json", j);
  write("tokenizer_config.json", {{"eos_token", {{"content", "<|begin_of_text|>"}}}});
  hpct::io::TokenizerSpec spec{"HFTokenizer", "", "", dir_.string()};  // the folder, as --tokenizer-model
  const auto tok = hpct::io::open_tokenizer(spec);
  EXPECT_EQ(tok->document_prefix(), (std::vector<int32_t>{50257}));
  EXPECT_EQ(tok->eod(), 50257);
  EXPECT_EQ(tok->vocab_size(), 50258u);
  write("tokenizer_config.json", {{"eos_token", "<|nope|>"}});
  const std::string msg = error_message([&] { hpct::io::open_tokenizer(spec); });
  EXPECT_TRUE(contains(msg, "eos_token '<|nope|>'") && contains(msg, "tokenizer_config.json")) << msg;
  // a template that adds a token after the text is refused by name
  j["post_processor"]["processors"][1]["single"].push_back(json::parse(R"({"SpecialToken": {"id": "<|begin_of_text|>"}})"));
  const std::string after = error_message([&] { Gpt2Tokenizer::from_hf_json(write("tokenizer.json", j), ""); });
  EXPECT_TRUE(contains(after, "after the text") && contains(after, path)) << after;
}

TEST_F(HfTokenizer, WhatChangesTheIdsAndIsNotImplementedIsRefusedByName) {
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& j) { j["normalizer"] = {{"type", "NFC"}}; }, "normalizer NFC"},
      {[](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}}; }, "pre_tokenizer Metaspace"},
      {[](json& j) { j["pre_tokenizer"]["add_prefix_space"] = true; }, "add_prefix_space"},
      {[](json& j) { j["model"]["byte_fallback"] = true; }, "model.byte_fallback"},
      {[](json& j) { j["model"]["type"] = "WordPiece"; }, "model type WordPiece"},
      {[](json& j) { j["decoder"] = {{"type", "Metaspace"}}; }, "decoder Metaspace"},
      {[](json& j) { j["added_tokens"][0]["lstrip"] = true; }, "lstrip"},
      {[](json& j) { j["model"]["merges"].push_back("qqqqqqqqqqqq z"); }, "'qqqqqqqqqqqq' is not in the vocab"},
  };
  for (const auto& [edit, needle] : cases) {
    json j = gpt2_json(false);
    edit(j);
    const std::string path = write("tokenizer.json", j);
    const std::string msg = error_message([&] { Gpt2Tokenizer::from_hf_json(path, ""); });
    EXPECT_TRUE(contains(msg, needle) && contains(msg, path)) << needle << ": " << msg;
  }
}

TEST(TokenizerSpec, TypesAndTheirFlags) {
  using hpct::io::check_tokenizer_spec;
  using hpct::io::TokenizerSpec;
  auto msg = [](const TokenizerSpec& s) { return error_message([&] { check_tokenizer_spec(s); }); };
  EXPECT_TRUE(contains(msg({"GPT2BPETokenizer", "", "m", ""}), "--vocab-file"));
  EXPECT_TRUE(contains(msg({"GPT2BPETokenizer", "v", "", ""}), "--merge-file"));
  EXPECT_TRUE(contains(msg({"GPT2BPETokenizer", "v", "m", "x.model"}), "--tokenizer-model is not read by GPT2BPETokenizer"));
  EXPECT_TRUE(contains(msg({"Llama2Tokenizer", "", "", ""}), "Llama2Tokenizer needs --tokenizer-model"));
  EXPECT_TRUE(contains(msg({"BertWordPieceCase", "", "", ""}), "a Megatron tokenizer not implemented here"));
  EXPECT_TRUE(contains(msg({"Gpt2", "", "", ""}), "'Gpt2' is unknown"));
  EXPECT_EQ(msg({"GPTSentencePieceTokenizer", "", "", "t.model"}), "(no error)");
}
