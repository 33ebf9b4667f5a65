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
#include "request.hpp"

namespace hpct::generate {

namespace {
std::atomic<int> g_signal{0};
extern "C" void on_signal(int s) { g_signal = s; }
}  // namespace

int answer(Session& s, const ServerOptions& o, const std::string& body, std::string& out) {
  try {
    if (!s.has_tokenizer()) throw BadRequest("this model has no tokenizer: the server takes text prompts only");
    Request r = parse_request(body, o.defaults, s.model().vocab);
    std::vector<model::Sample> samples;
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      model::Sample x;
      x.prompt = s.encode(r.prompts[i]);
      // Megatron's add_BOS: the end-of-document id before every prompt (an empty one needs it).
      if (r.add_bos) x.prompt.insert(x.prompt.begin(), s.eod());
      try {
        s.check_prompt(x.prompt, i, "prompts");
      } catch (const Error& e) {
        throw BadRequest(e.message());
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
        throw BadRequest("beam_width " + std::to_string(r.c.beam_width) + " needs " + std::to_string(2 * r.c.beam_width) +
                         " decoder slots; this server has " + std::to_string(s.generator().slots()) +
                         " (start it with a larger --micro-batch-size)");
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
    out = b.message();
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
