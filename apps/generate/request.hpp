// generate --server's requests: Megatron's run_text_generation_server.py fields in a JSON body,
// checked as its server checks them (its messages where it has one) into the settings of one
// generation. Fields Megatron has and this server does not serve are refused, not ignored. Apart
// from the server so that a fuzz target reads it alone (tests/fuzz/fuzz_generate_request.cpp).
#pragma once
#include <string>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/model/generation.hpp"

namespace hpct::generate {

/// A request the server answers with HTTP 400 and message() as the body.
struct BadRequest : Error {
  explicit BadRequest(const std::string& what) : Error(what) {}
};

struct Request {
  std::vector<std::string> prompts;  // 1 to 128
  model::GenerationConfig c;         // valid (GenerationConfig::validate)
  bool logprobs = false, add_bos = false, beam = false;  // beam: one prompt, c.beam_width set
  std::vector<std::string> stops;    // stop strings (stop_on_eol, stop_on_double_eol, stop)
};

/// body -> the request, the unset fields from defaults (the server's flags; tokens_to_generate
/// Megatron's 64); vocab bounds stop_token. Throws BadRequest.
Request parse_request(const std::string& body, const model::GenerationConfig& defaults, int vocab);

}  // namespace hpct::generate
