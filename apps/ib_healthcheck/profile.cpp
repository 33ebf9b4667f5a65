// Profile loading: strict JSON (unknown keys are errors), typed, validated, one-line errors.
#include "profile.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <regex>

#include "hpct/core/error.hpp"
#include "hpct/core/json_config.hpp"
#include "hpct/core/units.hpp"

#ifndef HPCT_HEALTHCHECK_PROFILE_DIR
#define HPCT_HEALTHCHECK_PROFILE_DIR ""
#endif

namespace hpct::healthcheck {

bool Threshold::passes(double v, double median) const {
  if (!std::isfinite(v)) return false;
  if (higher_is_better) {
    if (absolute && v < *absolute) return false;
    if (relative && std::isfinite(median) && v < *relative * median) return false;
  } else {
    if (absolute && v > *absolute) return false;
    if (relative && std::isfinite(median) && v > *relative * median) return false;
  }
  return true;
}

std::string Threshold::describe(double median) const {
  if (empty()) return "-";
  char buf[160];
  const char* op = higher_is_better ? ">=" : "<=";
  std::string s;
  if (absolute) {
    std::snprintf(buf, sizeof buf, "%s %.2f", op, *absolute);
    s = buf;
  }
  if (relative) {
    if (std::isfinite(median))
      std::snprintf(buf, sizeof buf, "%s %.2f (%.2g x median %.2f)", op, *relative * median, *relative, median);
    else
      std::snprintf(buf, sizeof buf, "%s %.2g x median", op, *relative);
    s += (s.empty() ? "" : ", ") + std::string(buf);
  }
  return s;
}

namespace {

[[noreturn]] void bad(const JsonSection& s, const std::string& key, const std::string& msg, const std::string& hint = "") {
  throw Error(msg, Error::Context{s.file(), s.key_path(key), hint});
}

uint64_t get_size(JsonSection& s, const std::string& key, uint64_t dflt) {
  auto v = s.get_string(key);
  if (!v) return dflt;
  try {
    return parse_size(*v, s.key_path(key));
  } catch (const Error& e) {
    throw Error(e.message(), Error::Context{s.file(), s.key_path(key), "write e.g. \"4M\", \"8G\" or \"4096\""});
  }
}

Threshold get_threshold(JsonSection& parent, const std::string& key, bool higher_is_better) {
  Threshold t;
  t.higher_is_better = higher_is_better;
  if (!parent.has(key)) return t;
  JsonSection s = parent.section(key);
  const char* abs_key = higher_is_better ? "min" : "max";
  const char* rel_key = higher_is_better ? "min_fraction_of_median" : "max_factor_of_median";
  t.absolute = s.get_number(abs_key);
  t.relative = s.get_number(rel_key);
  if (t.absolute && !(*t.absolute > 0)) bad(s, abs_key, "must be > 0");
  if (t.relative) {
    if (higher_is_better && !(*t.relative > 0 && *t.relative <= 1))
      bad(s, rel_key, "must be in (0, 1]", "e.g. 0.5: at least half the allocation's median");
    if (!higher_is_better && !(*t.relative >= 1))
      bad(s, rel_key, "must be >= 1", "e.g. 3: at most three times the allocation's median");
  }
  s.finish();
  if (t.empty())
    bad(parent, key, std::string("needs \"") + abs_key + "\" and/or \"" + rel_key + "\"");
  return t;
}

std::string resolve(const std::string& name_or_file) {
  if (name_or_file.find('/') != std::string::npos ||
      (name_or_file.size() > 5 && name_or_file.compare(name_or_file.size() - 5, 5, ".json") == 0))
    return name_or_file;
  std::vector<std::string> dirs;
  if (const char* src = std::getenv("HPCT_SOURCE_DIR"); src && *src) dirs.push_back(std::string(src) + "/inputs/healthcheck");
  // Installed: <prefix>/bin/ib_healthcheck next to <prefix>/share/hpctrain/inputs/healthcheck.
  char exe[4096];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    std::string bin(exe, static_cast<size_t>(n));
    dirs.push_back(bin.substr(0, bin.rfind('/')) + "/../share/hpctrain/inputs/healthcheck");
  }
  if (*HPCT_HEALTHCHECK_PROFILE_DIR) dirs.push_back(HPCT_HEALTHCHECK_PROFILE_DIR);
  for (const auto& d : dirs) {
    std::string p = d + "/" + name_or_file + ".json";
    if (::access(p.c_str(), R_OK) == 0) return p;
  }
  throw file_error(name_or_file, "no profile named '" + name_or_file + "'",
                   "pass a path to a .json file or a name in inputs/healthcheck/ (local, azure-ndv4, ...)");
}

// JsonSection::finish names the key but points at the training config docs; profiles have their own.
void finish(const JsonSection& s) {
  try {
    s.finish();
  } catch (const Error& e) {
    throw Error(e.message(), Error::Context{e.context().file, e.context().key, "see the profile keys in docs/healthcheck.md"});
  }
}

}  // namespace

Profile load_profile(const std::string& name_or_file) {
  Profile p;
  p.file = resolve(name_or_file);
  nlohmann::json j = JsonSection::load_file(p.file);
  JsonSection root(j, p.file);
  auto name = root.get_string("name");
  if (!name || name->empty()) bad(root, "name", "a profile needs a non-empty \"name\"");
  p.name = *name;
  p.description = root.get_string("description").value_or("");

  JsonSection node = root.section("node");
  {
    JsonSection cpu = node.section("cpu");
    p.cpu_min_cores = cpu.get_int("min_cores").value_or(1);
    if (p.cpu_min_cores < 1) bad(cpu, "min_cores", "must be >= 1");
    p.cpu_model_regex = cpu.get_string("model_regex").value_or("");
    try {
      std::regex re(p.cpu_model_regex);
    } catch (const std::regex_error& e) {
      bad(cpu, "model_regex", std::string("is not a valid regular expression: ") + e.what());
    }
    finish(cpu);
    JsonSection mem = node.section("memory");
    p.memory_min_bytes = get_size(mem, "min", 0);
    finish(mem);
    JsonSection huge = node.section("hugepages");
    p.hugepages_min = huge.get_int("min_total").value_or(0);
    if (p.hugepages_min < 0) bad(huge, "min_total", "must be >= 0");
    finish(huge);
    JsonSection ib = node.section("ib");
    p.ib_ports = ib.get_int("ports").value_or(0);
    if (p.ib_ports < 0) bad(ib, "ports", "must be >= 0");
    p.ib_min_rate_gbps = ib.get_number("min_rate_gbps").value_or(0);
    if (p.ib_min_rate_gbps < 0) bad(ib, "min_rate_gbps", "must be >= 0");
    p.ib_state = ib.get_string("state").value_or("ACTIVE");
    if (p.ib_state != "ACTIVE" && p.ib_state != "INIT" && p.ib_state != "DOWN" && p.ib_state != "ARMED")
      bad(ib, "state", "must be one of ACTIVE, INIT, ARMED, DOWN");
    p.ib_link_layer = ib.get_string("link_layer").value_or("");
    if (!p.ib_link_layer.empty() && p.ib_link_layer != "InfiniBand" && p.ib_link_layer != "Ethernet")
      bad(ib, "link_layer", "must be \"InfiniBand\" or \"Ethernet\" (RoCE)");
    finish(ib);
    JsonSection gpu = node.section("gpu");
    p.gpu_count = gpu.get_int("count").value_or(0);
    if (p.gpu_count < 0) bad(gpu, "count", "must be >= 0");
    p.gpu_min_memory = get_size(gpu, "min_memory", 0);
    finish(gpu);
    JsonSection disk = node.section("disk");
    p.disk_path = disk.get_string("path").value_or("/tmp");
    if (p.disk_path.empty() || p.disk_path[0] != '/') bad(disk, "path", "must be an absolute path");
    p.disk_min_free = get_size(disk, "min_free", 0);
    finish(disk);
    finish(node);
  }
  JsonSection fab = root.section("fabric");
  p.p2p_latency_us = get_threshold(fab, "p2p_latency_us", false);
  p.p2p_bw_GBps = get_threshold(fab, "p2p_bandwidth_GBps", true);
  p.p2p_bibw_GBps = get_threshold(fab, "p2p_bidir_bandwidth_GBps", true);
  p.allreduce_busbw_GBps = get_threshold(fab, "allreduce_busbw_GBps", true);
  p.alltoall_busbw_GBps = get_threshold(fab, "alltoall_busbw_GBps", true);
  p.nccl_allreduce_busbw_GBps = get_threshold(fab, "nccl_allreduce_busbw_GBps", true);
  p.nccl_alltoall_busbw_GBps = get_threshold(fab, "nccl_alltoall_busbw_GBps", true);
  finish(fab);
  JsonSection sizes = root.section("sizes");
  p.lat_size = get_size(sizes, "latency", p.lat_size);
  p.bw_size = get_size(sizes, "bandwidth", p.bw_size);
  p.coll_min = get_size(sizes, "collective_min", p.coll_min);
  p.coll_max = get_size(sizes, "collective_max", p.coll_max);
  if (p.lat_size == 0) bad(sizes, "latency", "must be at least 1 byte");
  if (p.bw_size == 0) bad(sizes, "bandwidth", "must be at least 1 byte");
  if (p.coll_min < 8) bad(sizes, "collective_min", "must be at least 8 bytes (2 floats)");
  if (p.coll_max < p.coll_min) bad(sizes, "collective_max", "must be >= collective_min");
  if (p.coll_max > (uint64_t(1) << 33)) bad(sizes, "collective_max", "must be at most 8G");
  finish(sizes);
  p.rounds = static_cast<int>(root.get_int("rounds").value_or(5));
  if (p.rounds < 1 || p.rounds > 1000) bad(root, "rounds", "must be in 1..1000");
  p.timeout_s = root.get_number("timeout_s").value_or(30);
  if (!(p.timeout_s > 0) || p.timeout_s > 86400) bad(root, "timeout_s", "must be in (0, 86400]");
  finish(root);
  return p;
}

}  // namespace hpct::healthcheck
