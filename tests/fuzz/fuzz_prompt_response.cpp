// Fuzz target: finetune's prompt/response JSON lines (--data-path FILE.jsonl). Input = the file's
// bytes, read with a byte-level BPE tokenizer of the 256 bytes and <|endoftext|> (no merges), then
// served as samples of 8 and of 64 tokens, packed and not: every sample's tokens and loss mask are
// read, and the masks' sum must be the dataset's target_tokens() (what the data set-up refuses a
// training split on when it is 0). Any other outcome than hpct::Error or a consistent dataset is a find.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "hpct/io/gpt2_tokenizer.hpp"
#include "hpct/io/prompt_response_dataset.hpp"

namespace {

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {  // the byte-level alphabet ends at U+0143: two bytes at most
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2's byte-level alphabet (printable bytes stand for themselves, the others for 256 + n) as a
// vocab of the 256 single bytes, with <|endoftext|> at 256.
const hpct::io::Gpt2Tokenizer& tokenizer() {
  static const hpct::io::Gpt2Tokenizer tok = [] {
    std::string vocab = "{";
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const uint32_t cp = printable ? b : 256 + n++;
      vocab += "\"" + std::string(cp == '"' || cp == '\\' ? "\\" : "") + utf8(cp) + "\": " + std::to_string(b) + ", ";
    }
    vocab += "\"<|endoftext|>\": 256}";
    const std::string v = hpct::fuzz::write_file("vocab.json", reinterpret_cast<const uint8_t*>(vocab.data()), vocab.size());
    const std::string merges = "#version: 0.2\n";
    const std::string m = hpct::fuzz::write_file("merges.txt", reinterpret_cast<const uint8_t*>(merges.data()), merges.size());
    return hpct::io::Gpt2Tokenizer::from_files(v, m);
  }();
  return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const hpct::io::Gpt2Tokenizer& tok = tokenizer();
  const std::string path = hpct::fuzz::write_file("data.jsonl", data, size);
  hpct::fuzz::refusal_ok([&] {
    const auto all = hpct::io::read_prompt_response(path, tok, "prompt", "response");
    for (size_t T : {size_t{8}, size_t{64}})
      for (bool pack : {false, true}) {
        hpct::io::PromptResponseDataset d(all, 0, all.size(), T, tok.eod(), 1, pack);
        std::vector<int32_t> s(T + 1);
        std::vector<uint8_t> m(T);
        size_t sum = 0;
        for (size_t i = 0; i < d.size(); ++i) {
          d.get(i, s.data());
          d.get_loss_mask(i, m.data());
          for (uint8_t x : m) sum += x;
        }
        if (sum != d.target_tokens()) std::abort();  // the count the refusal relies on is wrong
      }
  });
  return 0;
}
