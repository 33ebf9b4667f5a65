// Fuzz target: generate --server's request bodies (apps/generate/request.cpp), what any client on
// the network may send. Input = the body's bytes. A body is refused with BadRequest (an
// hpct::Error: the 400 line) or gives a request the generator can run: 1 to 128 prompts, settings
// that pass GenerationConfig::validate, at least one token to generate, a beam search of one
// prompt, a stop token below the vocabulary. Anything else is a find.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_util.hpp"
#include "request.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  hpct::model::GenerationConfig defaults;
  defaults.eod = 50256;
  constexpr int kVocab = 50257;
  hpct::fuzz::refusal_ok([&] {
    const hpct::generate::Request r = hpct::generate::parse_request(body, defaults, kVocab);
    if (r.prompts.empty() || r.prompts.size() > 128) std::abort();
    r.c.validate();  // throws (a find: not a BadRequest) if the parser let a bad setting through
    if (r.c.max_new < 1 || r.c.eod < 0 || r.c.eod >= kVocab) std::abort();
    if (!r.beam && r.c.beam_width != defaults.beam_width) std::abort();  // a width without a beam search
    if (r.beam && r.prompts.size() != 1) std::abort();
    if (r.c.sampling.top_k > 1000) std::abort();
    for (const auto& s : r.stops)
      if (s.empty()) std::abort();
  });
  return 0;
}
