// Prompt/response samples (io/prompt_response_dataset.hpp): prompt, response and end-of-document
// laid out from position 0, padded with end-of-document; the loss mask counts exactly the targets
// that are response tokens or the closing end-of-document; a long example is cut and counted; the
// order is a seeded permutation of the split's examples, repeated for further epochs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/io/prompt_response_dataset.hpp"

using namespace hpct::io;

namespace {
constexpr int32_t kEod = 99;
std::vector<PromptResponseExample> examples() {
  // prompt ids 10.., response ids 20.., then eod
  return {{{10, 11, 12, 20, 21, kEod}, 3}, {{10, 20, 21, 22, kEod}, 1}, {{10, 11, 12, 13, 14, 15, 20, 21, kEod}, 6}};
}
}  // namespace

TEST(PromptResponse, LayoutMaskPaddingAndCut) {
  const size_t T = 7;  // samples of 8 tokens: the third example (9 tokens) is cut
  PromptResponseDataset d(examples(), 0, 3, T, kEod, 1);
  EXPECT_EQ(d.size(), 3u);
  EXPECT_EQ(d.truncated(), 1u);
  std::set<int32_t> firsts;
  for (size_t i = 0; i < 3; ++i) {
    std::vector<int32_t> s(T + 1);
    std::vector<uint8_t> m(T);
    d.get(i, s.data());
    d.get_loss_mask(i, m.data());
    // Which example is it? Find it by its prompt length (the count of ids below 20).
    const int prompt = static_cast<int>(std::count_if(s.begin(), s.end(), [](int32_t x) { return x >= 10 && x < 20; }));
    firsts.insert(prompt);
    const size_t n = prompt == 3 ? 6 : prompt == 1 ? 5 : 9;  // the example's tokens with its eod
    for (size_t t = 0; t < T; ++t)  // target t is token t+1: a response token or the closing eod
      EXPECT_EQ(m[t], t + 1 >= (size_t)prompt && t + 1 < n ? 1 : 0) << "example with prompt " << prompt << ", target " << t;
    if (prompt == 3) {
      EXPECT_EQ(s, (std::vector<int32_t>{10, 11, 12, 20, 21, kEod, kEod, kEod}));
    }
    if (prompt == 6) {
      EXPECT_EQ(s, (std::vector<int32_t>{10, 11, 12, 13, 14, 15, 20, 21}));  // cut before its eod
    }
  }
  EXPECT_EQ(firsts, (std::set<int32_t>{1, 3, 6})) << "every example once per epoch";
  std::vector<int32_t> a(T + 1), b(T + 1);
  d.get(1, a.data());
  d.get(4, b.data());
  EXPECT_EQ(a, b) << "epochs repeat the order";
}

TEST(PromptResponse, SplitAndSeed) {
  PromptResponseDataset tail(examples(), 1, 3, 8, kEod, 1);
  EXPECT_EQ(tail.size(), 2u);
  EXPECT_THROW(PromptResponseDataset(examples(), 2, 2, 8, kEod, 1), hpct::Error);
  std::vector<std::vector<int32_t>> orders;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    PromptResponseDataset d(examples(), 0, 3, 8, kEod, seed);
    std::vector<int32_t> o;
    for (size_t i = 0; i < 3; ++i) {
      std::vector<int32_t> s(9);
      d.get(i, s.data());
      o.push_back(s[1]);
    }
    orders.push_back(o);
  }
  EXPECT_GT(std::set<std::vector<int32_t>>(orders.begin(), orders.end()).size(), 1u) << "the seed shuffles";
}

// Packing: the examples fill samples in the unpacked order (the same seed), each whole and ending
// with its eod, each with the mask it has alone (shifted to where it starts); nothing else counts.
TEST(PromptResponse, PackingKeepsEachExampleAndItsMask) {
  const size_t T = 11;  // 12 tokens: the 6- and 5-token examples fit together, the 9-token one does not
  size_t fewer = 0;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    PromptResponseDataset plain(examples(), 0, 3, T, kEod, seed), packed(examples(), 0, 3, T, kEod, seed, true);
    ASSERT_EQ(plain.size(), 3u);
    ASSERT_LE(packed.size(), 3u);
    fewer += packed.size() < 3;
    if (packed.size() < 3) {
      EXPECT_GT(packed.fill(), plain.fill());
    }
    std::vector<std::vector<int32_t>> alone;  // each plain sample's example, with its mask
    std::vector<std::vector<uint8_t>> alone_mask;
    for (size_t i = 0; i < 3; ++i) {
      std::vector<int32_t> s(T + 1);
      std::vector<uint8_t> m(T);
      plain.get(i, s.data());
      plain.get_loss_mask(i, m.data());
      const size_t n = (size_t)(std::find(s.begin(), s.end(), kEod) - s.begin()) + 1;
      alone.emplace_back(s.begin(), s.begin() + n);
      alone_mask.emplace_back(m.begin(), m.begin() + std::min(n, T));
    }
    size_t next = 0;
    for (size_t i = 0; i < packed.size(); ++i) {
      std::vector<int32_t> s(T + 1);
      std::vector<uint8_t> m(T);
      packed.get(i, s.data());
      packed.get_loss_mask(i, m.data());
      size_t at = 0;
      std::vector<uint8_t> want(T, 0);
      while (at <= T && s[at] != kEod) {  // an example starts here (padding is eod only)
        ASSERT_LT(next, alone.size());
        const auto& e = alone[next];
        ASSERT_LE(at + e.size(), T + 1);
        EXPECT_TRUE(std::equal(e.begin(), e.end(), s.begin() + (std::ptrdiff_t)at)) << "seed " << seed << " sample " << i;
        for (size_t t = 0; t < alone_mask[next].size() && at + t < T; ++t) want[at + t] = alone_mask[next][t];
        at += e.size();
        ++next;
      }
      for (size_t t = at; t <= T; ++t) EXPECT_EQ(s[t], kEod) << "padding";
      EXPECT_EQ(m, want) << "seed " << seed << " sample " << i;
    }
    EXPECT_EQ(next, 3u) << "every example once per epoch, in the unpacked order";
  }
  EXPECT_GT(fewer, 0u) << "no seed put two examples in one sample";
}

// The loss-counted targets the dataset reports are the sum of its masks, packed or not; examples
// that keep none (a prompt that fills the sample, an empty prompt and response) are counted (issue
// 47 item 7: such data trained at loss 0 with exit 0).
TEST(PromptResponse, TargetTokensAreTheMasksSum) {
  std::vector<PromptResponseExample> ex = examples();
  ex.push_back({{kEod}, 0});                          // empty prompt and response
  ex.push_back({{10, 11, 12, 13, 14, 15, 16, 17, 20, kEod}, 8});  // its prompt fills T = 7 targets
  for (bool pack : {false, true})
    for (size_t T : {7u, 12u}) {
      PromptResponseDataset d(ex, 0, ex.size(), T, kEod, 3, pack);
      size_t sum = 0;
      std::vector<uint8_t> m(T);
      for (size_t i = 0; i < d.size(); ++i) {
        d.get_loss_mask(i, m.data());
        for (uint8_t v : m) sum += v;
      }
      EXPECT_EQ(d.target_tokens(), sum) << "pack " << pack << " T " << T;
      EXPECT_EQ(d.examples_without_targets(), T == 7 ? 2u : 1u) << "pack " << pack << " T " << T;
    }
  // Only prompts that fill the sample: nothing to train.
  std::vector<PromptResponseExample> long_prompts = {{{10, 11, 12, 13, 14, 20, kEod}, 5}, {{10, 11, 12, 13, 14, 15, kEod}, 6}};
  PromptResponseDataset none(long_prompts, 0, 2, 4, kEod, 1);
  EXPECT_EQ(none.target_tokens(), 0u);
  EXPECT_EQ(none.examples_without_targets(), 2u);
}

// Reading examples: JSON lines with --prompt-key/--response-key, or Alpaca's records (a JSON array
// as alpaca_data.json ships, or one record per line) in Stanford Alpaca's prompt template. A byte
// tokenizer (id = byte, eod 256, an optional prefix id 300) makes the expected ids the texts' bytes.
namespace {
class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(std::vector<int32_t> prefix = {}) : prefix_(std::move(prefix)) {}
  void encode_append(std::string_view text, std::vector<int32_t>& out) const override {
    for (unsigned char ch : text) out.push_back(ch);
  }
  std::string decode(const std::vector<int32_t>& ids) const override { return std::string(ids.begin(), ids.end()); }
  int32_t eod() const override { return 256; }
  const std::vector<int32_t>& document_prefix() const override { return prefix_; }
  size_t vocab_size() const override { return 301; }
  std::string describe() const override { return "bytes"; }

 private:
  std::vector<int32_t> prefix_;
};

std::string write_file(const std::string& name, const std::string& text) {
  const std::string p = ::testing::TempDir() + name;
  std::FILE* f = std::fopen(p.c_str(), "wb");
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  return p;
}

PromptResponseExample bytes_of(const std::string& prompt, const std::string& response, std::vector<int32_t> prefix = {}) {
  PromptResponseExample e;
  e.ids = prefix;
  e.ids.insert(e.ids.end(), prompt.begin(), prompt.end());
  e.prompt = (int)e.ids.size();
  e.ids.insert(e.ids.end(), response.begin(), response.end());
  e.ids.push_back(256);
  return e;
}

const char* kWithInput =
    "Below is an instruction that describes a task, paired with an input that provides further context. Write a "
    "response that appropriately completes the request.\n\n### Instruction:\nSort the words\n\n### Input:\nb a\n\n### Response:";
const char* kNoInput =
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\nSay hi\n\n### Response:";

void expect_examples(const std::vector<PromptResponseExample>& got, const std::vector<PromptResponseExample>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].ids, want[i].ids) << "example " << i;
    EXPECT_EQ(got[i].prompt, want[i].prompt) << "example " << i;
  }
}
}  // namespace

TEST(PromptResponseFile, AlpacaArrayInAlpacasTemplate) {
  const std::string p = write_file("alpaca_data.json", R"([
  {"instruction": "Sort the words", "input": "b a", "output": "a b"},
  {"instruction": "Say hi", "input": "", "output": "hi"},
  {"instruction": "Say hi", "output": "hi"}
])");
  const ByteTokenizer tok;
  expect_examples(read_prompt_response(p, tok, "prompt", "response"),
                  {bytes_of(kWithInput, "a b"), bytes_of(kNoInput, "hi"), bytes_of(kNoInput, "hi")});
}

TEST(PromptResponseFile, JsonLinesOfEitherKindAndThePrefix) {
  const std::string p = write_file("mixed.jsonl",
                                   "{\"prompt\": \"Q: 1+1?\", \"response\": \" 2\", \"id\": 7}\n\n"
                                   "{\"instruction\": \"Sort the words\", \"input\": \"b a\", \"output\": \"a b\"}\n");
  expect_examples(read_prompt_response(p, ByteTokenizer({300}), "prompt", "response"),
                  {bytes_of("Q: 1+1?", " 2", {300}), bytes_of(kWithInput, "a b", {300})});
  // Other keys named by --prompt-key / --response-key.
  const std::string q = write_file("keys.jsonl", "{\"question\": \"x\", \"answer\": \"y\"}\n");
  expect_examples(read_prompt_response(q, ByteTokenizer(), "question", "answer"), {bytes_of("x", "y")});
}

TEST(PromptResponseFile, BadExamplesNameTheFileAndThePlace) {
  auto error_of = [](const std::string& path) {
    try {
      read_prompt_response(path, ByteTokenizer(), "prompt", "response");
    } catch (const hpct::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string a = write_file("bad_array.json", R"([{"instruction": "x", "output": "y"}, 5])");
  EXPECT_NE(error_of(a).find(a + "[1]"), std::string::npos) << error_of(a);
  const std::string b = write_file("no_output.json", R"([{"instruction": "x", "input": "y"}])");
  EXPECT_NE(error_of(b).find("'output'"), std::string::npos) << error_of(b);
  const std::string c = write_file("no_response.jsonl", "{\"prompt\": \"x\"}\n");
  EXPECT_NE(error_of(c).find(c + ":1"), std::string::npos) << error_of(c);
  EXPECT_NE(error_of(c).find("'response'"), std::string::npos) << error_of(c);
  const std::string d = write_file("empty.json", "[]");
  EXPECT_NE(error_of(d).find("holds no example"), std::string::npos) << error_of(d);
}
