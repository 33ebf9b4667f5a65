// Fuzz target: a Hugging Face tokenizer.json (Megatron's HFTokenizer, --tokenizer-model). Input = a
// whole file; when it loads, its own bytes and a fixed text are encoded and decoded.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.hpp"
#include "hpct/io/gpt2_tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hpct::fuzz::write_file("tokenizer.json", data, size);
  hpct::fuzz::refusal_ok([&] {
    const auto tok = hpct::io::Gpt2Tokenizer::from_hf_json(path, "");
    const std::string text(reinterpret_cast<const char*>(data), size < 256 ? size : 256);
    for (const std::string& t : {text, std::string("Hello <|endoftext|> w\xC3\xB6rld 12345\n\n")}) {
      const auto ids = tok.encode(t);
      hpct::fuzz::refusal_ok([&] { (void)tok.decode(ids); });
    }
    hpct::fuzz::refusal_ok([&] { (void)tok.eod(); });
  });
  return 0;
}
