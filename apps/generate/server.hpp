// generate --server: text generation over HTTP, in the spirit of Megatron's
// run_text_generation_server.py. PUT (or POST) a JSON object to /api with Megatron's request fields;
// the answer is Megatron's JSON ({"text", "segments", "logprobs"}, or "scores" for a beam search),
// plus "tokens" (the generated ids). Requests are served one at a time (a lock around the model,
// as Megatron's), each prompt of a request from its own stream of the seed: a request answers with
// the tokens the command line gives for the same prompts, seed and settings.
#pragma once
#include <string>

#include "session.hpp"

namespace hpct::generate {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless asked: the server has no authentication
  int port = 5000;                 // Megatron's; 0: any free port (printed)
  model::GenerationConfig defaults;  // --seed, --max-new-tokens, sampling flags: a request's defaults
};

/// Serves until SIGINT or SIGTERM; prints "> serving on http://HOST:PORT/api" once it listens.
/// Returns the number of requests answered.
long serve(Session& session, const ServerOptions& o);

/// One request's JSON body -> the response's JSON and HTTP status (400 with a one-line message for
/// a bad request). Separate from the socket for tests and for the lock's scope.
int answer(Session& session, const ServerOptions& o, const std::string& body, std::string& out);

}  // namespace hpct::generate
