// Sampled and beam-search generation over the cached decoder (see generation.hpp).
#include "hpct/model/generation.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <tuple>

#include "hpct/core/error.hpp"

namespace hpct::model {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// log softmax of the V logits into out, max-subtracted, the sum in double.
void log_softmax(const float* x, int V, std::vector<double>& out) {
  out.resize(V);
  const float m = *std::max_element(x, x + V);
  double z = 0;
  for (int i = 0; i < V; ++i) z += std::exp(double(x[i]) - m);
  const double lz = std::log(z) + m;
  for (int i = 0; i < V; ++i) out[i] = double(x[i]) - lz;
}
}  // namespace

void GenerationConfig::validate() const {
  sampling.validate();
  if (max_new < 1) throw config_error("--max-new-tokens", "--max-new-tokens must be >= 1, got " + std::to_string(max_new));
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty))
    throw config_error("--repetition-penalty", "--repetition-penalty must be > 0 (1: off), got " + std::to_string(repetition_penalty));
  if (beam_width < 1) throw config_error("--beam-width", "--beam-width must be >= 1 (1: no beam search), got " + std::to_string(beam_width));
  if (!std::isfinite(length_penalty))
    throw config_error("--length-penalty", "--length-penalty must be a finite number, got " + std::to_string(length_penalty));
  if (beam_width > 1 && !cache)
    throw config_error("--beam-width", "beam search runs on the key/value cache", "drop --no-kv-cache (--recompute)");
}

GenerationStats& GenerationStats::operator+=(const GenerationStats& o) {
  prefill_s += o.prefill_s;
  decode_s += o.decode_s;
  prefill_tokens += o.prefill_tokens;
  new_tokens += o.new_tokens;
  return *this;
}

void apply_repetition_penalty(float* logits, int V, const int32_t* seen, size_t n, double penalty) {
  if (penalty == 1.0 || n == 0) return;
  std::vector<char> done(V, 0);
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = seen[i];
    if (id < 0 || id >= V || done[id]) continue;
    done[id] = 1;
    const double x = logits[id];
    logits[id] = static_cast<float>(x > 0 ? x / penalty : x * penalty);
  }
}

Generator::Generator(const GptConfig& cfg, const float* params, int vocab, int slots)
    : dec_(cfg, params, slots), vocab_(vocab), Vp_(cfg.padded_vocab()) {
  if (vocab < 1 || vocab > Vp_) throw Error("Generator: vocabulary " + std::to_string(vocab) + " not in 1.." + std::to_string(Vp_));
}

GenerationStats Generator::sample(std::vector<Sample>& samples, const GenerationConfig& c, const StopCheck& stop) {
  c.validate();
  GenerationStats st;
  const int B = slots(), T = dec_.config().positions();
  std::vector<float> logits((size_t)B * Vp_), row(Vp_);
  std::vector<int32_t> seen;
  for (size_t g0 = 0; g0 < samples.size(); g0 += B) {
    const int n = std::min<int>(B, static_cast<int>(samples.size() - g0));
    std::vector<std::mt19937_64> rng;
    std::vector<int> live;  // slots still generating
    std::vector<int32_t> next(n);
    auto t0 = Clock::now();
    for (int s = 0; s < n; ++s) {
      Sample& r = samples[g0 + s];
      r.ids.clear();
      r.logprobs.clear();
      rng.emplace_back(c.seed * 0x9E3779B97F4A7C15ull + r.stream);
      dec_.clear(s);
      dec_.extend(s, r.prompt.data(), (int)r.prompt.size(), logits.data() + (size_t)s * Vp_);
      st.prefill_tokens += (long long)r.prompt.size();
      live.push_back(s);
    }
    auto t1 = Clock::now();
    st.prefill_s += std::chrono::duration<double>(t1 - t0).count();
    while (!live.empty()) {
      std::vector<int> going;
      for (size_t i = 0; i < live.size(); ++i) {
        const int s = live[i];
        Sample& r = samples[g0 + s];
        const float* x = logits.data() + i * Vp_;
        double lp = 0;
        int32_t id;
        if (c.repetition_penalty != 1.0) {  // on a copy: the log-probability stays the model's
          std::copy_n(x, Vp_, row.data());
          seen.assign(r.prompt.begin(), r.prompt.end());
          seen.insert(seen.end(), r.ids.begin(), r.ids.end());
          apply_repetition_penalty(row.data(), vocab_, seen.data(), seen.size(), c.repetition_penalty);
          id = sample_token(row.data(), vocab_, c.sampling, rng[s], nullptr);
          lp = token_logprob(x, vocab_, id);
        } else {
          id = sample_token(x, vocab_, c.sampling, rng[s], &lp);
        }
        r.ids.push_back(id);
        r.logprobs.push_back(lp);
        ++st.new_tokens;
        if (id == c.eod) r.stop = "eod";
        else if ((int)r.ids.size() >= c.max_new) r.stop = "max_new_tokens";
        else if (stop && stop(r)) r.stop = "stop_sequence";
        else if (dec_.length(s) >= T) r.stop = "length";
        else {
          going.push_back(s);
          next[going.size() - 1] = id;
        }
      }
      live = going;
      if (live.empty()) break;
      if (c.cache) {
        dec_.step(live.data(), next.data(), (int)live.size(), logits.data());
      } else {  // every position again: the cost the cache saves
        for (size_t i = 0; i < live.size(); ++i) {
          const Sample& r = samples[g0 + live[i]];
          std::vector<int32_t> ctx = r.prompt;
          ctx.insert(ctx.end(), r.ids.begin(), r.ids.end());
          dec_.clear(live[i]);
          dec_.extend(live[i], ctx.data(), (int)ctx.size(), logits.data() + i * Vp_);
        }
      }
    }
    st.decode_s += since(t1);
  }
  return st;
}

std::vector<Sample> Generator::beam_search(const std::vector<int32_t>& prompt, const GenerationConfig& c, GenerationStats* stats) {
  c.validate();
  const int W = c.beam_width, T = dec_.config().positions();
  if (slots() < 2 * W)
    throw config_error("--beam-width", "a beam of " + std::to_string(W) + " needs " + std::to_string(2 * W) +
                                           " decoder slots, this generator has " + std::to_string(slots()));
  struct Beam {
    int slot;
    std::vector<int32_t> ids;
    std::vector<double> logprobs;
    double sum;
  };
  auto score = [&](double sum, size_t len) { return sum / std::pow(double(len), c.length_penalty); };
  GenerationStats st;
  auto t0 = Clock::now();
  std::vector<float> logits((size_t)2 * W * Vp_), row(Vp_);
  dec_.clear(0);
  dec_.extend(0, prompt.data(), (int)prompt.size(), logits.data());
  st.prefill_tokens += (long long)prompt.size();
  st.prefill_s += since(t0);
  auto t1 = Clock::now();
  std::vector<Beam> beams{{0, {}, {}, 0.0}};
  std::vector<Sample> done;  // finished hypotheses, best first, at most W
  auto finish = [&](const Beam& b, int32_t id, double lp, const std::string& why) {
    Sample s;
    s.prompt = prompt;
    s.ids = b.ids;
    s.logprobs = b.logprobs;
    double sum = b.sum;
    if (id >= 0) s.ids.push_back(id), s.logprobs.push_back(lp), sum += lp;
    s.stop = why;
    s.score = score(sum, s.ids.size());
    done.push_back(std::move(s));
    std::stable_sort(done.begin(), done.end(), [](const Sample& a, const Sample& b) { return a.score > b.score; });
    if ((int)done.size() > W) done.pop_back();
  };
  std::vector<double> ls;
  std::vector<int32_t> seen;
  for (;;) {
    // Every beam's best 2W continuations, then the best 2W of all, ties by beam and id.
    std::vector<std::tuple<double, int, int32_t, double>> cand;  // (sum, beam, id, logprob)
    for (size_t b = 0; b < beams.size(); ++b) {
      const float* x = logits.data() + b * Vp_;
      log_softmax(x, vocab_, ls);
      std::vector<double> ranked = ls;
      if (c.repetition_penalty != 1.0) {  // ranks by the penalised distribution; reports the model's
        std::copy_n(x, Vp_, row.data());
        seen.assign(prompt.begin(), prompt.end());
        seen.insert(seen.end(), beams[b].ids.begin(), beams[b].ids.end());
        apply_repetition_penalty(row.data(), vocab_, seen.data(), seen.size(), c.repetition_penalty);
        log_softmax(row.data(), vocab_, ranked);
      }
      std::vector<int32_t> ids(vocab_);
      for (int i = 0; i < vocab_; ++i) ids[i] = i;
      const int k = std::min(2 * W, vocab_);
      std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                        [&](int32_t a, int32_t z) { return ranked[a] > ranked[z] || (ranked[a] == ranked[z] && a < z); });
      for (int i = 0; i < k; ++i) cand.emplace_back(beams[b].sum + ranked[ids[i]], (int)b, ids[i], ls[ids[i]]);
    }
    std::stable_sort(cand.begin(), cand.end(), [](const auto& a, const auto& z) { return std::get<0>(a) > std::get<0>(z); });
    std::vector<Beam> next;
    for (size_t r = 0; r < cand.size() && (int)next.size() < W; ++r) {
      const auto& [sum, b, id, lp] = cand[r];
      if (id == c.eod) {
        if ((int)r < W) finish(beams[b], id, lp, "eod");  // only an end among the best W counts
        continue;
      }
      Beam nb{b, beams[b].ids, beams[b].logprobs, beams[b].sum + lp};  // slot: its parent's index, for now
      nb.ids.push_back(id);
      nb.logprobs.push_back(lp);
      next.push_back(std::move(nb));
    }
    if (next.empty()) break;
    st.new_tokens += (long long)next.size();
    const size_t len = next[0].ids.size();
    // At max_new, or with no position left for the next token, the live ones are finished too.
    const bool at_max = (int)len >= c.max_new, at_end = dec_.length(beams[0].slot) >= T;
    if (at_max || at_end) {
      for (const Beam& b : next) finish(b, -1, 0, at_max ? "max_new_tokens" : "length");
      break;
    }
    // Done when W are finished and the best live one cannot beat the worst of them (the length
    // grows, so with length_penalty > 0 a negative sum only falls: Hugging Face's heuristic).
    if ((int)done.size() >= W && score(next[0].sum, len) <= done.back().score) break;
    // The kept hypotheses move into the other half of the slots, their parents' caches copied.
    const int base = beams[0].slot < W ? W : 0;
    std::vector<int> slot_of(next.size());
    std::vector<int32_t> tok(next.size());
    for (size_t j = 0; j < next.size(); ++j) {
      dec_.copy(beams[next[j].slot].slot, base + (int)j);
      next[j].slot = slot_of[j] = base + (int)j;
      tok[j] = next[j].ids.back();
    }
    beams = std::move(next);
    dec_.step(slot_of.data(), tok.data(), (int)beams.size(), logits.data());
  }
  st.decode_s += since(t1);
  if (stats) *stats += st;
  return done;
}

}  // namespace hpct::model
