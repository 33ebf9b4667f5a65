// Sequence-length warmup: the schedule and its ds_config blocks. See curriculum.hpp.
#include "hpct/engine/data/curriculum.hpp"
#include "hpct/engine/data/data_sampling.hpp"

#include <cmath>
#include <cstdint>
#include <optional>

#include "hpct/core/error.hpp"

namespace hpct::engine {

int CurriculumConfig::difficulty_at(long long s) const {
  if (schedule_type == "fixed_discrete") {
    for (size_t i = 0; i < max_step.size(); ++i)
      if (s <= max_step[i]) return difficulty[i];
    return difficulty.back();
  }
  const double root = schedule_type == "fixed_root" ? root_degree : 1.0;
  const double frac = std::pow(double(s) / double(total_curriculum_step), 1.0 / root);
  long long d = (long long)std::floor(frac * double(max_difficulty - min_difficulty) + min_difficulty);
  d -= d % difficulty_step;
  return (int)std::min<long long>(d, max_difficulty);
}

int CurriculumConfig::seqlen(long long it, int full) const {
  if (!enabled) return full;
  if (min_difficulty >= max_difficulty) return std::min(max_difficulty, full);  // DeepSpeed never updates it
  // DeepSpeed stops updating once the length reached max_difficulty: the first step that did.
  long long latch = -1;
  if (schedule_type == "fixed_discrete") {
    for (size_t i = 0; i < difficulty.size() && latch < 0; ++i)
      if (difficulty[i] >= max_difficulty) latch = i == 0 ? 1 : max_step[i - 1] + 1;
  }
  const long long s = it + 1;
  const int d = latch > 0 && s >= latch ? difficulty_at(latch) : difficulty_at(s);
  return std::min(d, full);
}

void CurriculumConfig::validate(int full, const std::string& file) const {
  if (!enabled) return;
  auto bad = [&](const std::string& k, const std::string& what, const std::string& fix = "") {
    throw Error("'" + key + "." + k + "' " + what, Error::Context{file, key + "." + k, fix});
  };
  if (schedule_type != "fixed_linear" && schedule_type != "fixed_root" && schedule_type != "fixed_discrete")
    bad("schedule_type", "is '" + printable(schedule_type) + "'; this version runs fixed_linear, fixed_root or fixed_discrete",
        "a custom schedule needs DeepSpeed's Python callback; use one of the three");
  if (min_difficulty < 1) bad("min_difficulty", "must be at least 1 token, got " + std::to_string(min_difficulty));
  if (max_difficulty < min_difficulty)
    bad("max_difficulty", "= " + std::to_string(max_difficulty) + " is below min_difficulty " + std::to_string(min_difficulty));
  if (max_difficulty > full)
    bad("max_difficulty", "= " + std::to_string(max_difficulty) + " exceeds --seq-length " + std::to_string(full),
        "samples are --seq-length tokens long: the curriculum can only shorten them");
  if (schedule_type == "fixed_discrete") {
    if (difficulty.empty() || difficulty.size() != max_step.size() + 1)
      bad("schedule_config.difficulty", "has " + std::to_string(difficulty.size()) + " entries and max_step " +
                                            std::to_string(max_step.size()) + "; it needs one more than max_step",
          "the last difficulty holds for every step after the last max_step");
    for (int d : difficulty)
      if (d < 1 || d > full)
        bad("schedule_config.difficulty", "holds " + std::to_string(d) + ", outside 1 to --seq-length " + std::to_string(full));
    for (size_t i = 0; i < max_step.size(); ++i)
      if (max_step[i] < 1 || (i > 0 && max_step[i] <= max_step[i - 1]))
        bad("schedule_config.max_step", "must be positive and increasing, got " + std::to_string(max_step[i]) +
                                            " at position " + std::to_string(i));
    return;
  }
  if (total_curriculum_step < 1)
    bad("schedule_config.total_curriculum_step", "must be at least 1, got " + std::to_string(total_curriculum_step));
  if (difficulty_step < 1) bad("schedule_config.difficulty_step", "must be at least 1, got " + std::to_string(difficulty_step));
  if (schedule_type == "fixed_root" && !(root_degree > 0 && std::isfinite(root_degree)))
    bad("schedule_config.root_degree", "must be a positive number");
  if (difficulty_at(1) < 1)
    bad("min_difficulty", "= " + std::to_string(min_difficulty) + " rounds down to 0 tokens at difficulty_step " +
                              std::to_string(difficulty_step) + " (DeepSpeed rounds each length down to a multiple of it)",
        "make min_difficulty at least difficulty_step");
}

namespace detail {
namespace {

// Reads a block holding min/max_difficulty, schedule_type and schedule_config (DeepSpeed's keys).
void read_schedule(JsonSection& s, const nlohmann::json& raw, CurriculumConfig& c) {
  auto int_of = [&](JsonSection& sec, const char* k, long long lo, long long hi) -> std::optional<long long> {
    auto v = sec.get_int(k);
    if (v && (*v < lo || *v > hi))
      throw Error("'" + sec.key_path(k) + "' = " + std::to_string(*v) + " is out of range (" + std::to_string(lo) + " to " +
                      std::to_string(hi) + ")", Error::Context{sec.file(), sec.key_path(k), ""});
    return v;
  };
  auto need = [&](JsonSection& sec, const char* k, std::optional<long long> v) {
    if (!v) throw Error("'" + sec.key_path(k) + "' is required", Error::Context{sec.file(), sec.key_path(k), ""});
    return *v;
  };
  c.min_difficulty = (int)need(s, "min_difficulty", int_of(s, "min_difficulty", 0, INT32_MAX));
  c.max_difficulty = (int)need(s, "max_difficulty", int_of(s, "max_difficulty", 0, INT32_MAX));
  c.schedule_type = s.get_string("schedule_type").value_or("");
  if (c.schedule_type.empty())
    throw Error("'" + s.key_path("schedule_type") + "' is required", Error::Context{s.file(), s.key_path("schedule_type"), ""});
  if (!raw.contains("schedule_config"))  // (section() would read an absent block as empty)
    throw Error("'" + s.key_path("schedule_config") + "' is required", Error::Context{s.file(), s.key_path("schedule_config"), ""});
  JsonSection sc = s.section("schedule_config");
  const nlohmann::json& rsc = raw.at("schedule_config");
  if (c.schedule_type == "fixed_discrete") {
    for (const char* k : {"difficulty", "max_step"}) {
      sc.ignore(k);
      const std::string kp = sc.key_path(k);
      if (!rsc.contains(k) || !rsc[k].is_array())
        throw Error("'" + kp + "' must be an array of integers", Error::Context{sc.file(), kp, ""});
      for (const auto& v : rsc[k]) {
        if (!v.is_number_integer()) throw Error("'" + kp + "' must hold integers only", Error::Context{sc.file(), kp, ""});
        const long long x = v.get<long long>();
        if (x < 0 || x > INT32_MAX) throw Error("'" + kp + "' holds " + v.dump() + ", out of range", Error::Context{sc.file(), kp, ""});
        if (std::string(k) == "difficulty") c.difficulty.push_back((int)x);
        else c.max_step.push_back(x);
      }
    }
  } else {
    c.total_curriculum_step = need(sc, "total_curriculum_step", int_of(sc, "total_curriculum_step", 0, 1ll << 53));
    c.difficulty_step = (int)need(sc, "difficulty_step", int_of(sc, "difficulty_step", 0, INT32_MAX));
    if (c.schedule_type == "fixed_root") {
      auto r = sc.get_number("root_degree");
      if (!r) throw Error("'" + sc.key_path("root_degree") + "' is required for fixed_root", Error::Context{sc.file(), sc.key_path("root_degree"), ""});
      c.root_degree = *r;
    }
  }
  sc.finish();
}

[[noreturn]] void not_built(const JsonSection& s, const std::string& k, const std::string& what) {
  throw Error("'" + s.key_path(k) + "': " + what + " is not implemented in this version",
              Error::Context{s.file(), s.key_path(k), "remove it or set its enabled to false (docs/data-efficiency.md)"});
}

}  // namespace

void apply_ds_data_efficiency(JsonSection& root, const nlohmann::json& raw, CurriculumConfig& cfg, RandomLtdConfig& ltd,
                              std::vector<MetricCurriculumConfig>& metric_cfgs) {
  if (root.has("curriculum_learning")) {  // DeepSpeed's legacy block
    JsonSection s = root.section("curriculum_learning");
    if (s.get_bool("enabled").value_or(false)) {
      const std::string type = s.get_string("curriculum_type").value_or("seqlen");
      if (type != "seqlen") not_built(s, "curriculum_type", "curriculum_type '" + printable(type) + "' (only seqlen)");
      cfg.enabled = true;
      cfg.key = "curriculum_learning";
      read_schedule(s, raw.at("curriculum_learning"), cfg);
    } else {
      for (const char* k : {"curriculum_type", "min_difficulty", "max_difficulty", "schedule_type", "schedule_config"}) s.ignore(k);
    }
    s.finish();
  }
  if (!root.has("data_efficiency")) return;
  JsonSection de = root.section("data_efficiency");
  const nlohmann::json& rde = raw.at("data_efficiency");
  const bool on = de.get_bool("enabled").value_or(false);
  de.get_int("seed");  // accepted: the data order is --seed's (one seed for the whole run)
  if (de.has("data_routing")) {
    JsonSection dr = de.section("data_routing");
    apply_ds_random_ltd(dr, rde.at("data_routing"), on, ltd);
    dr.finish();
  }
  if (de.has("data_sampling")) {
    JsonSection ds = de.section("data_sampling");
    const bool sampling = ds.get_bool("enabled").value_or(false);
    ds.get_int("num_epochs");   // accepted: samples are drawn from the index map, epoch after epoch
    ds.get_int("num_workers");  // accepted: the data loader is the trainer's own
    if (ds.has("curriculum_learning")) {
      JsonSection cl = ds.section("curriculum_learning");
      const bool cl_on = cl.get_bool("enabled").value_or(false);  // read whatever the blocks above say
      const bool enabled = on && sampling && cl_on;
      cl.get_string("data_cluster_path");  // accepted: seqlen_truncate needs no analyzer output
      if (cl.has("curriculum_metrics")) {
        cl.ignore("curriculum_metrics");
        const nlohmann::json& metrics = rde.at("data_sampling").at("curriculum_learning").at("curriculum_metrics");
        if (!metrics.is_object())
          throw Error("'" + cl.key_path("curriculum_metrics") + "' must be an object", Error::Context{cl.file(), cl.key_path("curriculum_metrics"), ""});
        JsonSection ms(metrics, cl.file(), cl.key_path("curriculum_metrics"));
        for (auto it = metrics.begin(); it != metrics.end(); ++it) {
          if (it.key() != "seqlen_truncate") {  // a data metric: the analyzer's index files
            JsonSection m = ms.section(it.key());
            if (!enabled) {
              for (auto k = it.value().begin(); k != it.value().end(); ++k) m.ignore(k.key());
              m.finish();
              continue;
            }
            MetricCurriculumConfig metric;
            metric.enabled = true;
            metric.metric = it.key();
            metric.index_to_sample_path = m.get_string("index_to_sample_path").value_or("");
            metric.index_to_metric_path = m.get_string("index_to_metric_path").value_or("");
            metric.difficulty_type = m.get_string("difficulty_type").value_or("value");
            metric.clustering_type = m.get_string("clustering_type").value_or("schedule_based");
            metric.schedule.enabled = true;
            metric.schedule.key = ms.key_path(it.key());
            read_schedule(m, it.value(), metric.schedule);
            m.finish();
            metric_cfgs.push_back(std::move(metric));
            continue;
          }
          JsonSection m = ms.section("seqlen_truncate");
          for (const char* k : {"index_to_sample_path", "index_to_metric_path"}) m.get_string(k);  // not needed for seqlen
          const std::string dt = m.get_string("difficulty_type").value_or("value");
          if (dt != "value")
            throw Error("'" + m.key_path("difficulty_type") + "' must be value for seqlen_truncate, got '" + printable(dt) + "'",
                        Error::Context{m.file(), m.key_path("difficulty_type"), "a length is a value, not a percentile"});
          m.get_string("clustering_type");  // single_cluster or schedule_based: one cluster either way
          if (enabled) {
            if (cfg.enabled)
              throw Error("'" + ms.key_path("seqlen_truncate") + "' and 'curriculum_learning' both set a sequence-length curriculum",
                          Error::Context{m.file(), "curriculum_learning", "keep one of them"});
            cfg.enabled = true;
            cfg.key = ms.key_path("seqlen_truncate");
            read_schedule(m, metrics.at("seqlen_truncate"), cfg);
          } else {
            for (const char* k : {"min_difficulty", "max_difficulty", "schedule_type", "schedule_config"}) m.ignore(k);
          }
          m.finish();
        }
        ms.finish();
      }
      cl.finish();
    }
    ds.finish();
  }
  de.finish();
}

}  // namespace detail
}  // namespace hpct::engine
