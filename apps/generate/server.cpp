// generate's HTTP server (see server.hpp), on Debian's cpp-httplib.
#include "server.hpp"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "hpct/core/error.hpp"

namespace hpct::generate {

namespace {
std::atomic<int> g_signal{0};
extern "C" void on_signal(int s) { g_signal = s; }

struct BadRequest {
  std::string what;
};

// Megatron's request fields, checked as its server checks them (the messages are its own where it
// has one); fields it has that this server does not serve are refused, not ignored.
struct Request {
  std::vector<std::string> prompts;
  model::GenerationConfig c;
  bool logprobs = false, add_bos = false, beam = false;
  std::vector<std::string> stops;
};

Request parse_request(const Session& s, const ServerOptions& o, const std::string& body) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const std::exception& e) {
    throw BadRequest{std::string("the body is not JSON: ") + e.what()};
  }
  if (!j.is_object()) throw BadRequest{"the body must be a JSON object"};
  if (j.contains("max_len")) throw BadRequest{"max_len is no longer used.  Replace with tokens_to_generate"};
  if (j.contains("sentences")) throw BadRequest{"sentences is no longer used.  Replace with prompts"};
  if (!j.contains("prompts")) throw BadRequest{"prompts argument required"};
  const auto& p = j["prompts"];
  if (!p.is_array()) throw BadRequest{"prompts is not a list of strings"};
  if (p.empty()) throw BadRequest{"prompts is empty"};
  if (p.size() > 128) throw BadRequest{"Maximum number of prompts is 128"};
  Request r;
  for (const auto& x : p) {
    if (!x.is_string()) throw BadRequest{"prompts is not a list of strings"};
    r.prompts.push_back(x.get<std::string>());
  }
  r.c = o.defaults;
  auto number = [&](const char* key) { return j.contains(key) && j[key].is_number(); };
  auto boolean = [&](const char* key, bool& out) {
    if (!j.contains(key)) return;
    if (!j[key].is_boolean()) throw BadRequest{std::string(key) + " must be a boolean value"};
    out = j[key].get<bool>();
  };
  if (j.contains("tokens_to_generate")) {
    if (!j["tokens_to_generate"].is_number_integer() || j["tokens_to_generate"].get<long long>() < 1)
      throw BadRequest{"tokens_to_generate must be an integer greater than 0 (prompt log-probabilities alone are not served)"};
    r.c.max_new = static_cast<int>(std::min<long long>(j["tokens_to_generate"].get<long long>(), 1 << 20));
  } else {
    r.c.max_new = 64;  // Megatron's default
  }
  boolean("logprobs", r.logprobs);
  if (j.contains("temperature")) {
    if (!number("temperature") || !(j["temperature"].get<double>() > 0 && j["temperature"].get<double>() <= 100))
      throw BadRequest{"temperature must be a positive number less than or equal to 100.0"};
    r.c.sampling.temperature = j["temperature"].get<double>();
  }
  if (j.contains("top_k")) {
    if (!j["top_k"].is_number_integer() || j["top_k"].get<long long>() < 0 || j["top_k"].get<long long>() > 1000)
      throw BadRequest{"top_k must be an integer equal to or greater than 0 and less than or equal to 1000"};
    r.c.sampling.top_k = j["top_k"].get<int>();
  }
  if (j.contains("top_p")) {
    if (!number("top_p") || !(j["top_p"].get<double>() >= 0 && j["top_p"].get<double>() <= 1))
      throw BadRequest{"top_p must be a positive float less than or equal to 1.0"};
    const double tp = j["top_p"].get<double>();
    r.c.sampling.top_p = tp == 0 ? 1.0 : tp;  // Megatron's 0: no nucleus cut
    if (tp > 0 && r.c.sampling.top_k > 0) throw BadRequest{"cannot set both top-k and top-p samplings."};
  }
  for (const char* unsupported : {"top_p_decay", "top_p_bound"})
    if (j.contains(unsupported) && !(number(unsupported) && j[unsupported].get<double>() == 0))
      throw BadRequest{std::string(unsupported) + " is not served here (top_p stays fixed); leave it out or 0"};
  bool no_colon = false;
  boolean("prevent_newline_after_colon", no_colon);
  if (no_colon) throw BadRequest{"prevent_newline_after_colon is not served here; leave it out or false"};
  boolean("add_BOS", r.add_bos);
  for (const auto& t : r.prompts)
    if (t.empty() && !r.add_bos) throw BadRequest{"Empty prompts require add_BOS=true"};
  bool eol = false, double_eol = false, no_log = false;
  boolean("stop_on_eol", eol);
  boolean("stop_on_double_eol", double_eol);
  boolean("no_log", no_log);
  if (eol) r.stops.push_back("\n");
  else if (double_eol) r.stops.push_back("\n\n");
  if (j.contains("stop")) {  // Hugging Face's / OpenAI's stop strings, as --stop
    const auto& st = j["stop"];
    if (st.is_string()) r.stops.push_back(st.get<std::string>());
    else if (st.is_array() && std::all_of(st.begin(), st.end(), [](const nlohmann::json& x) { return x.is_string() && !x.get<std::string>().empty(); }))
      for (const auto& x : st) r.stops.push_back(x.get<std::string>());
    else throw BadRequest{"stop must be a string or a list of non-empty strings"};
  }
  if (j.contains("random_seed")) {
    if (!j["random_seed"].is_number_integer()) throw BadRequest{"random_seed must be integer"};
    const long long seed = j["random_seed"].get<long long>();
    if (seed < -1) throw BadRequest{"random_seed must be a positive integer (-1: the server's --seed)"};
    if (seed >= 0) r.c.seed = static_cast<uint64_t>(seed);
  }
  if (j.contains("repetition_penalty")) {
    if (!number("repetition_penalty") || !(j["repetition_penalty"].get<double>() > 0))
      throw BadRequest{"repetition_penalty must be a number > 0 (1: off)"};
    r.c.repetition_penalty = j["repetition_penalty"].get<double>();
  }
  if (j.contains("beam_width") && !j["beam_width"].is_null()) {
    if (!j["beam_width"].is_number_integer() || j["beam_width"].get<long long>() < 1 || j["beam_width"].get<long long>() > 64)
      throw BadRequest{"beam_width must be integer > 0 (at most 64)"};
    if (r.prompts.size() > 1) throw BadRequest{"When doing beam_search, batch size must be 1"};
    r.beam = true;
    r.c.beam_width = j["beam_width"].get<int>();
  }
  if (j.contains("stop_token")) {
    if (!j["stop_token"].is_number_integer() || j["stop_token"].get<long long>() < 0 || j["stop_token"].get<long long>() >= s.model().vocab)
      throw BadRequest{"stop_token must be an integer below the vocabulary " + std::to_string(s.model().vocab)};
    r.c.eod = j["stop_token"].get<int32_t>();
  }
  if (j.contains("length_penalty")) {
    if (!number("length_penalty")) throw BadRequest{"length_penalty must be a number"};
    r.c.length_penalty = j["length_penalty"].get<double>();
  }
  try {
    r.c.validate();
  } catch (const Error& e) {
    throw BadRequest{e.what()};
  }
  return r;
}
}  // namespace

int answer(Session& s, const ServerOptions& o, const std::string& body, std::string& out) {
  try {
    if (!s.has_tokenizer()) throw BadRequest{"this model has no tokenizer: the server takes text prompts only"};
    Request r = parse_request(s, o, body);
    std::vector<model::Sample> samples;
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      model::Sample x;
      x.prompt = s.encode(r.prompts[i]);
      if (r.add_bos && x.prompt.empty()) x.prompt.push_back(s.eod());  // Megatron's BOS: the end-of-document id
      try {
        s.check_prompt(x.prompt, i, "prompts");
      } catch (const Error& e) {
        throw BadRequest{e.what()};
      }
      x.stream = i;
      samples.push_back(std::move(x));
    }
    nlohmann::json res;
    auto texts = [&](const std::vector<model::Sample>& v, bool with_logprobs) {
      nlohmann::json text = nlohmann::json::array(), seg = nlohmann::json::array(), lp = nlohmann::json::array(),
                     ids = nlohmann::json::array();
      for (const auto& x : v) {
        text.push_back(s.prompt_text(x) + s.continuation(x));
        nlohmann::json pieces = nlohmann::json::array();
        model::Sample upto = x;  // each generated token's text: the continuation's growth
        std::string before;
        for (size_t k = 0; k < x.ids.size(); ++k) {
          upto.ids.assign(x.ids.begin(), x.ids.begin() + k + 1);
          const std::string now = s.continuation(upto);
          pieces.push_back(now.size() >= before.size() ? now.substr(before.size()) : std::string());
          before = now;
        }
        seg.push_back(pieces);
        ids.push_back(x.ids);
        if (with_logprobs) lp.push_back(x.logprobs);
      }
      res["text"] = text;
      res["segments"] = seg;
      res["tokens"] = ids;
      if (with_logprobs) res["logprobs"] = lp;
    };
    if (r.beam) {
      if (r.c.beam_width * 2 > s.generator().slots())
        throw BadRequest{"beam_width " + std::to_string(r.c.beam_width) + " needs " + std::to_string(2 * r.c.beam_width) +
                         " decoder slots; this server has " + std::to_string(s.generator().slots()) +
                         " (start it with a larger --micro-batch-size)"};
      auto beams = s.generator().beam_search(samples[0].prompt, r.c);
      texts(beams, false);
      nlohmann::json scores = nlohmann::json::array();
      for (const auto& b : beams) scores.push_back(b.score);
      res["scores"] = scores;
    } else {
      s.generator().sample(samples, r.c, s.stop_check(r.stops));
      texts(samples, r.logprobs);
    }
    out = res.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return 200;
  } catch (const BadRequest& b) {
    out = b.what;
    return 400;
  }
}

long serve(Session& s, const ServerOptions& o) {
  httplib::Server svr;
  std::mutex lock;  // one generation at a time: the decoder's caches are shared
  std::atomic<long> served{0};
  auto handler = [&](const httplib::Request& req, httplib::Response& res) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string out;
    int status;
    {
      std::lock_guard<std::mutex> g(lock);
      try {
        status = answer(s, o, req.body, out);
      } catch (const std::exception& e) {  // not the request's fault: say so, keep serving
        status = 500;
        out = std::string("generation failed: ") + e.what();
      }
    }
    res.status = status;
    res.set_content(out + (status == 200 ? "" : "\n"), status == 200 ? "application/json" : "text/plain");
    ++served;
    std::printf("> %s %s from %s: %d in %.3f s\n", req.method.c_str(), req.path.c_str(), req.remote_addr.c_str(), status,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  };
  svr.Put("/api", handler);
  svr.Post("/api", handler);
  svr.set_payload_max_length(64u << 20);
  int port = o.port;
  if (port == 0) {
    port = svr.bind_to_any_port(o.host);
    if (port < 0) throw config_error("--host", "cannot listen on " + o.host + " (any port)");
  } else if (!svr.bind_to_port(o.host, port)) {
    throw config_error("--port", "cannot listen on " + o.host + ":" + std::to_string(port),
                       "is another server there? choose another --port (0: any free one)");
  }
  g_signal = 0;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::thread watch([&] {  // a signal handler may not stop the server itself
    while (!g_signal) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    svr.stop();
  });
  std::printf("> serving on http://%s:%d/api (PUT or POST JSON; SIGINT or SIGTERM stops)\n", o.host.c_str(), port);
  std::fflush(stdout);
  svr.listen_after_bind();
  if (!g_signal) g_signal = -1;  // listen ended on its own: let the watcher go
  watch.join();
  std::printf("> server stopped after %ld requests\n", served.load());
  return served;
}

}  // namespace hpct::generate
