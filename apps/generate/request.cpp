// generate --server's request fields (see request.hpp).
#include "request.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace hpct::generate {

Request parse_request(const std::string& body, const model::GenerationConfig& defaults, int vocab) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const std::exception& e) {
    throw BadRequest(std::string("the body is not JSON: ") + e.what());
  }
  if (!j.is_object()) throw BadRequest("the body must be a JSON object");
  if (j.contains("max_len")) throw BadRequest("max_len is no longer used.  Replace with tokens_to_generate");
  if (j.contains("sentences")) throw BadRequest("sentences is no longer used.  Replace with prompts");
  if (!j.contains("prompts")) throw BadRequest("prompts argument required");
  const auto& p = j["prompts"];
  if (!p.is_array()) throw BadRequest("prompts is not a list of strings");
  if (p.empty()) throw BadRequest("prompts is empty");
  if (p.size() > 128) throw BadRequest("Maximum number of prompts is 128");
  Request r;
  for (const auto& x : p) {
    if (!x.is_string()) throw BadRequest("prompts is not a list of strings");
    r.prompts.push_back(x.get<std::string>());
  }
  r.c = defaults;
  auto number = [&](const char* key) { return j.contains(key) && j[key].is_number(); };
  auto boolean = [&](const char* key, bool& out) {
    if (!j.contains(key)) return;
    if (!j[key].is_boolean()) throw BadRequest(std::string(key) + " must be a boolean value");
    out = j[key].get<bool>();
  };
  if (j.contains("tokens_to_generate")) {
    if (!j["tokens_to_generate"].is_number_integer() || j["tokens_to_generate"].get<long long>() < 1)
      throw BadRequest("tokens_to_generate must be an integer greater than 0 (prompt log-probabilities alone are not served)");
    r.c.max_new = static_cast<int>(std::min<long long>(j["tokens_to_generate"].get<long long>(), 1 << 20));
  } else {
    r.c.max_new = 64;  // Megatron's default
  }
  boolean("logprobs", r.logprobs);
  if (j.contains("temperature")) {
    if (!number("temperature") || !(j["temperature"].get<double>() > 0 && j["temperature"].get<double>() <= 100))
      throw BadRequest("temperature must be a positive number less than or equal to 100.0");
    r.c.sampling.temperature = j["temperature"].get<double>();
  }
  if (j.contains("top_k")) {
    if (!j["top_k"].is_number_integer() || j["top_k"].get<long long>() < 0 || j["top_k"].get<long long>() > 1000)
      throw BadRequest("top_k must be an integer equal to or greater than 0 and less than or equal to 1000");
    r.c.sampling.top_k = j["top_k"].get<int>();
  }
  if (j.contains("top_p")) {
    if (!number("top_p") || !(j["top_p"].get<double>() >= 0 && j["top_p"].get<double>() <= 1))
      throw BadRequest("top_p must be a positive float less than or equal to 1.0");
    const double tp = j["top_p"].get<double>();
    r.c.sampling.top_p = tp == 0 ? 1.0 : tp;  // Megatron's 0: no nucleus cut
    if (tp > 0 && r.c.sampling.top_k > 0) throw BadRequest("cannot set both top-k and top-p samplings.");
  }
  for (const char* unsupported : {"top_p_decay", "top_p_bound"})
    if (j.contains(unsupported) && !(number(unsupported) && j[unsupported].get<double>() == 0))
      throw BadRequest(std::string(unsupported) + " is not served here (top_p stays fixed); leave it out or 0");
  bool no_colon = false;
  boolean("prevent_newline_after_colon", no_colon);
  if (no_colon) throw BadRequest("prevent_newline_after_colon is not served here; leave it out or false");
  boolean("add_BOS", r.add_bos);
  for (const auto& t : r.prompts)
    if (t.empty() && !r.add_bos) throw BadRequest("Empty prompts require add_BOS=true");
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
    else throw BadRequest("stop must be a string or a list of non-empty strings");
  }
  if (j.contains("random_seed")) {
    if (!j["random_seed"].is_number_integer()) throw BadRequest("random_seed must be integer");
    const long long seed = j["random_seed"].get<long long>();
    if (seed < -1) throw BadRequest("random_seed must be a positive integer (-1: the server's --seed)");
    if (seed >= 0) r.c.seed = static_cast<uint64_t>(seed);
  }
  if (j.contains("repetition_penalty")) {
    if (!number("repetition_penalty") || !(j["repetition_penalty"].get<double>() > 0))
      throw BadRequest("repetition_penalty must be a number > 0 (1: off)");
    r.c.repetition_penalty = j["repetition_penalty"].get<double>();
  }
  if (j.contains("beam_width") && !j["beam_width"].is_null()) {
    if (!j["beam_width"].is_number_integer() || j["beam_width"].get<long long>() < 1 || j["beam_width"].get<long long>() > 64)
      throw BadRequest("beam_width must be integer > 0 (at most 64)");
    if (r.prompts.size() > 1) throw BadRequest("When doing beam_search, batch size must be 1");
    r.beam = true;
    r.c.beam_width = j["beam_width"].get<int>();
  }
  if (j.contains("stop_token")) {
    if (!j["stop_token"].is_number_integer() || j["stop_token"].get<long long>() < 0 || j["stop_token"].get<long long>() >= vocab)
      throw BadRequest("stop_token must be an integer below the vocabulary " + std::to_string(vocab));
    r.c.eod = j["stop_token"].get<int32_t>();
  }
  if (j.contains("length_penalty")) {
    if (!number("length_penalty")) throw BadRequest("length_penalty must be a number");
    r.c.length_penalty = j["length_penalty"].get<double>();
  }
  try {
    r.c.validate();
  } catch (const Error& e) {
    throw BadRequest(e.message());
  }
  return r;
}

}  // namespace hpct::generate
