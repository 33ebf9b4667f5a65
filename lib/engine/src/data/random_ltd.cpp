// random-LTD's schedule and ds_config block (see random_ltd.hpp, docs/data-efficiency.md).
#include "hpct/engine/data/random_ltd.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "hpct/core/error.hpp"

namespace hpct::engine {

int RandomLtdConfig::kept_at(long long it) const {
  if (min_value >= max_value) return max_value;
  const double r = std::floor(double(it) / double(require_steps) * double(max_value - min_value) + double(min_value));
  long long v = r >= double(max_value) ? max_value : static_cast<long long>(r);
  v -= v % std::max(1, seq_per_step);
  return static_cast<int>(std::min<long long>(v, max_value));
}

std::vector<int> RandomLtdConfig::layers(int num_layers) const {
  if (!layer_ids.empty()) return layer_ids;
  std::vector<int> v;
  for (int l = 1; l + 1 < num_layers; ++l) v.push_back(l);
  return v;
}

long long RandomLtdConfig::step_layer_tokens(long long it, int T, int num_layers, long long global_batch) const {
  const long long Lr = enabled ? (long long)layers(num_layers).size() : 0;
  return global_batch * ((long long)kept(it, T) * Lr + (long long)T * (num_layers - Lr));
}

void RandomLtdConfig::validate(int num_layers, int seq_length, int global_batch, int micro_batch,
                               const std::string& file) const {
  if (!enabled) return;
  auto bad = [&](const std::string& k, const std::string& what, const std::string& fix = "") {
    throw Error("'" + key + "." + k + "' " + what, Error::Context{file, key + "." + k, fix});
  };
  if (total_layer_num != 0 && total_layer_num != num_layers)
    bad("total_layer_num", "= " + std::to_string(total_layer_num) + " but the model has --num-layers " + std::to_string(num_layers));
  for (size_t i = 0; i < layer_ids.size(); ++i) {
    if (layer_ids[i] < 0 || layer_ids[i] >= num_layers)
      bad("random_ltd_layer_id", "holds " + std::to_string(layer_ids[i]) + ", not a layer of the " +
                                     std::to_string(num_layers) + "-layer model (0-based ids)");
    if (i > 0 && layer_ids[i] <= layer_ids[i - 1])
      bad("random_ltd_layer_id", "must list distinct layers in increasing order");
  }
  const size_t n = layers(num_layers).size();
  if (layer_num_given && (size_t)layer_num != n)
    bad("random_ltd_layer_num", "= " + std::to_string(layer_num) + " but " + std::to_string(n) + " layers drop tokens" +
                                    (layer_ids.empty() ? " (every layer but the first and the last)" : " (random_ltd_layer_id)"));
  if (n == 0)
    bad("random_ltd_layer_id", "leaves no layer to drop tokens in (a " + std::to_string(num_layers) + "-layer model)",
        "list the layers in random_ltd_layer_id, or disable random_ltd");
  if (min_value < 1) bad("random_ltd_schedule.min_value", "must be at least 1 token, got " + std::to_string(min_value));
  if (max_value < min_value)
    bad("random_ltd_schedule.max_value", "= " + std::to_string(max_value) + " is below min_value " + std::to_string(min_value));
  if (max_value > seq_length)
    bad("random_ltd_schedule.max_value", "= " + std::to_string(max_value) + " exceeds --seq-length " + std::to_string(seq_length),
        "a layer can keep at most every token: usually max_value is the sequence length");
  if (seq_per_step < 1)
    bad("random_ltd_schedule.schedule_config.seq_per_step", "must be at least 1, got " + std::to_string(seq_per_step));
  if (require_steps < 1)
    bad("random_ltd_schedule.schedule_config.require_steps", "must be at least 1, got " + std::to_string(require_steps));
  if (kept_at(0) < 1)
    bad("random_ltd_schedule.min_value", "= " + std::to_string(min_value) + " rounds down to 0 tokens at seq_per_step " +
                                             std::to_string(seq_per_step),
        "make min_value at least seq_per_step");
  if (global_batch_size != 0 && global_batch_size != global_batch)
    bad("global_batch_size", "= " + std::to_string(global_batch_size) + " but the run's global batch is " +
                                 std::to_string(global_batch), "make them agree (or remove the key)");
  if (micro_batch_size != 0 && micro_batch_size != micro_batch)
    bad("micro_batch_size", "= " + std::to_string(micro_batch_size) + " but the run's micro-batch is " +
                                std::to_string(micro_batch), "make them agree (or remove the key)");
  if (layer_token_lr && total_layer_tokens <= warmup_layer_tokens)
    bad("layer_token_lr_schedule.total_layer_tokens", "= " + std::to_string(total_layer_tokens) +
                                                          " must exceed warmup_layer_tokens " + std::to_string(warmup_layer_tokens));
}

namespace detail {

namespace {
std::optional<long long> int_in(JsonSection& s, const char* k, long long lo, long long hi) {
  auto v = s.get_int(k);
  if (v && (*v < lo || *v > hi))
    throw Error("'" + s.key_path(k) + "' = " + std::to_string(*v) + " is out of range (" + std::to_string(lo) + " to " +
                    std::to_string(hi) + ")", Error::Context{s.file(), s.key_path(k), ""});
  return v;
}
long long required(JsonSection& s, const char* k, std::optional<long long> v) {
  if (!v) throw Error("'" + s.key_path(k) + "' is required", Error::Context{s.file(), s.key_path(k), ""});
  return *v;
}
void must_be(JsonSection& s, const char* k, const std::string& got, std::initializer_list<const char*> ok,
             const std::string& why) {
  for (const char* o : ok)
    if (got == o) return;
  throw Error("'" + s.key_path(k) + "' is '" + printable(got) + "'; " + why, Error::Context{s.file(), s.key_path(k), ""});
}
}  // namespace

void apply_ds_random_ltd(JsonSection& dr, const nlohmann::json& raw, bool de_on, RandomLtdConfig& c) {
  const bool routing_on = de_on && dr.get_bool("enabled").value_or(false);
  if (!dr.has("random_ltd")) return;
  JsonSection s = dr.section("random_ltd");
  const bool on = routing_on && s.get_bool("enabled").value_or(false);
  if (!on) {  // a disabled block is accepted whatever it holds (templates keep their values)
    for (auto it = raw.at("random_ltd").begin(); it != raw.at("random_ltd").end(); ++it) s.ignore(it.key());
    s.finish();
    return;
  }
  c.enabled = true;
  c.key = dr.key_path("random_ltd");
  c.total_layer_num = (int)int_in(s, "total_layer_num", 1, INT32_MAX).value_or(0);
  if (auto n = int_in(s, "random_ltd_layer_num", 0, INT32_MAX)) c.layer_num_given = true, c.layer_num = (int)*n;
  if (s.has("random_ltd_layer_id")) {
    s.ignore("random_ltd_layer_id");
    const nlohmann::json& ids = raw.at("random_ltd").at("random_ltd_layer_id");
    const std::string kp = s.key_path("random_ltd_layer_id");
    if (!ids.is_array()) throw Error("'" + kp + "' must be an array of layer indices", Error::Context{s.file(), kp, ""});
    for (const auto& v : ids) {
      if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() > INT32_MAX)
        throw Error("'" + kp + "' holds " + json_excerpt(v) + "; layer indices are integers from 0",
                    Error::Context{s.file(), kp, ""});
      c.layer_ids.push_back(v.get<int>());
    }
  }
  s.get_string("model_mask_name");  // accepted: the causal mask is the model's own
  must_be(s, "model_type", s.get_string("model_type").value_or("decoder"), {"decoder"},
          "this version's models are GPT decoders (an encoder needs BERT's per-sample mask gathering)");
  must_be(s, "hidden_state_order", s.get_string("hidden_state_order").value_or("batch_seq_dim"),
          {"batch_seq_dim", "seq_batch_dim"}, "DeepSpeed takes batch_seq_dim or seq_batch_dim");
  c.micro_batch_size = (int)int_in(s, "micro_batch_size", 1, INT32_MAX).value_or(0);
  c.global_batch_size = (int)int_in(s, "global_batch_size", 1, INT32_MAX).value_or(0);
  {
    JsonSection sch = s.section("random_ltd_schedule");
    c.min_value = (int)required(sch, "min_value", int_in(sch, "min_value", 0, INT32_MAX));
    c.max_value = (int)required(sch, "max_value", int_in(sch, "max_value", 0, INT32_MAX));
    must_be(sch, "schedule_type", sch.get_string("schedule_type").value_or("fixed_linear"), {"fixed_linear"},
            "DeepSpeed's random-LTD scheduler has fixed_linear only");
    JsonSection sc = sch.section("schedule_config");
    c.require_steps = required(sc, "require_steps", int_in(sc, "require_steps", 0, 1ll << 53));
    c.seq_per_step = (int)int_in(sc, "seq_per_step", 0, INT32_MAX).value_or(1);
    sc.finish();
    sch.finish();
  }
  if (s.has("layer_token_lr_schedule")) {
    JsonSection lr = s.section("layer_token_lr_schedule");
    c.layer_token_lr = lr.get_bool("enabled").value_or(false);
    if (c.layer_token_lr) {
      c.total_layer_tokens = required(lr, "total_layer_tokens", int_in(lr, "total_layer_tokens", 1, 1ll << 62));
      c.warmup_layer_tokens = int_in(lr, "warmup_layer_tokens", 0, 1ll << 62).value_or(0);
      must_be(lr, "warmup_type", lr.get_string("warmup_type").value_or("linear"), {"linear"},
              "the layer-token warmup is linear (the decay follows --lr-decay-style)");
    } else {
      for (const char* k : {"total_layer_tokens", "warmup_layer_tokens", "warmup_type"}) lr.ignore(k);
    }
    lr.finish();
  }
  s.finish();
}

}  // namespace detail
}  // namespace hpct::engine
