// Evaluation of the raw rows: medians, limits, PASS/FAIL, blame, verdict, JSON.
#include "evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace hpct::healthcheck {
namespace {

double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

double num(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

std::string fmt(double v, int prec = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

}  // namespace

Evaluation::Evaluation(const Profile& profile, std::vector<std::string> nodes) : profile_(profile), nodes_(std::move(nodes)) {
  for (const auto& n : nodes_) reasons_[n];
}

std::string Evaluation::add_node_rows(const nlohmann::json& rows) {
  ReportTable t({{"node", ""}, {"item", ""}, {"value", ""}, {"expected", ""}, {"result", ""}, {"note", ""}});
  for (const auto& r : rows) {
    std::string value = r["value"].is_null() ? "-" : r["value"].is_string() ? r["value"].get<std::string>() : r["value"].dump();
    std::string node = r["node"], item = r["item"], result = r["result"];
    t.add_row({node, item, value, r["expected"].get<std::string>(), result, r["note"].get<std::string>()});
    if (result == "FAIL")
      reasons_[node].push_back("node " + item + " " + value + " (expected " + r["expected"].get<std::string>() + ")");
    else if (result == "SKIP")
      notes_.push_back(node + ": " + item + " not checked: " + r["note"].get<std::string>());
  }
  checks_["node"] = {{"rows", t.json()}};
  return t.text();
}

std::string Evaluation::add_p2p(const std::string& check, const nlohmann::json& rows, const std::vector<ExpectedRow>& expected,
                                const std::vector<int>& silent_ranks) {
  std::set<std::string> silent;
  for (int r : silent_ranks) silent.insert(nodes_[static_cast<size_t>(r)]);
  // Merge each expected row with what its owner (or its partner, after a timeout) reported.
  struct Row {
    ExpectedRow e;
    double value = NAN;
    uint64_t size = 0;
    std::string unit, error, limit, result, note;
  };
  std::vector<Row> merged;
  for (const auto& e : expected) {
    Row m;
    m.e = e;
    m.unit = e.metric == "latency" ? "us" : e.metric == "data" ? "bytes" : "GB/s";
    bool found = false;
    for (const auto& r : rows) {
      if (r["metric"] != e.metric || r["subject"] != e.subject) continue;
      found = true;
      if (r["value"].is_number()) m.value = r["value"].get<double>();
      m.size = r.value("size", uint64_t(0));
      std::string err = r.value("error", "");
      if (!err.empty()) m.error = err;
    }
    if (!found) m.error = "no result: " + nodes_[static_cast<size_t>(e.owner)] + " did not report";
    merged.push_back(m);
  }
  std::map<std::string, double> med;
  for (const char* metric : {"latency", "bandwidth", "bidir_bandwidth"}) {
    std::vector<double> v;
    for (const auto& m : merged)
      if (m.e.metric == metric) v.push_back(m.value);
    med[metric] = median(v);
  }
  if (check == "mpi_p2p") mpi_p2p_bw_median_ = med["bandwidth"];
  ReportTable t({{"metric", ""}, {"pair", ""}, {"size", "B"}, {"value", ""}, {"unit", ""}, {"limit", ""}, {"result", ""}, {"note", ""}});
  // failed[node] = partners it failed with; partners[node] = all its partners in this check.
  std::map<std::string, std::set<std::string>> partners, failed;
  std::map<std::string, std::string> worst;  // node -> first failed row, for the reason
  std::set<std::pair<std::string, std::string>> failed_pairs;
  for (auto& m : merged) {
    const std::string& na = nodes_[static_cast<size_t>(m.e.a)];
    const std::string& nb = nodes_[static_cast<size_t>(m.e.b)];
    partners[na].insert(nb);
    partners[nb].insert(na);
    bool pass;
    if (m.e.metric == "data") {
      m.limit = "== 0";
      pass = m.value == 0;
    } else {
      const Threshold& th = m.e.metric == "latency" ? profile_.p2p_latency_us
                            : m.e.metric == "bandwidth" ? profile_.p2p_bw_GBps : profile_.p2p_bibw_GBps;
      m.limit = th.describe(med[m.e.metric]);
      pass = th.passes(m.value, med[m.e.metric]);
    }
    if (!m.error.empty()) pass = false;
    m.result = pass ? "PASS" : "FAIL";
    m.note = m.error;
    if (!pass) {
      failed[na].insert(nb);
      failed[nb].insert(na);
      failed_pairs.insert({na, nb});
      std::string what = m.e.metric + " " + m.e.subject + " " +
                         (m.error.empty() ? fmt(m.value) + " " + m.unit + " (limit " + m.limit + ")" : m.error);
      if (!worst.count(na)) worst[na] = what;
      if (!worst.count(nb)) worst[nb] = what;
    }
    ReportTable::Cell value = std::isfinite(m.value) ? ReportTable::Cell(m.value) : ReportTable::Cell(std::monostate{});
    t.add_row({m.e.metric, m.e.subject, static_cast<int64_t>(m.size), value, m.unit, m.limit, m.result, m.note});
  }
  // Blame.
  std::set<std::string> blamed;
  if (!silent.empty()) {
    // The silent node(s) caused the timeouts of this check; they are named by add_silent().
    for (const auto& n : silent) blamed.insert(n);
    if (!failed_pairs.empty())
      notes_.push_back(check + ": pair failures with timeouts are not held against the partners of " +
                       [&] { std::string s; for (const auto& n : silent) s += (s.empty() ? "" : ",") + n; return s; }());
  } else {
    for (const auto& [node, f] : failed) {
      size_t k = f.size(), m = partners[node].size();
      if (2 * k > m) {
        blamed.insert(node);
        reasons_[node].push_back(check + ": failed with " + std::to_string(k) + " of " + std::to_string(m) +
                                 " partners (" + worst[node] + ")");
      }
    }
    for (const auto& [a, b] : failed_pairs) {
      if (!blamed.count(a) && !blamed.count(b))
        allocation_reasons_.push_back(check + ": link " + a + "<->" + b +
                                      " failed while both nodes passed with most partners (suspect the link or switch port)");
    }
  }
  checks_[check] = {{"rows", t.json()}, {"medians", {{"latency_us", std::isfinite(med["latency"]) ? nlohmann::json(med["latency"]) : nlohmann::json(nullptr)},
                                                      {"bandwidth_GBps", std::isfinite(med["bandwidth"]) ? nlohmann::json(med["bandwidth"]) : nlohmann::json(nullptr)},
                                                      {"bidir_bandwidth_GBps", std::isfinite(med["bidir_bandwidth"]) ? nlohmann::json(med["bidir_bandwidth"]) : nlohmann::json(nullptr)}}}};
  return t.text();
}

std::string Evaluation::add_collective(const std::string& kind, const nlohmann::json& rows, const std::vector<int>& silent_ranks) {
  const int n = static_cast<int>(nodes_.size());
  const Threshold& th = kind == "allreduce"        ? profile_.allreduce_busbw_GBps
                        : kind == "alltoall"       ? profile_.alltoall_busbw_GBps
                        : kind == "nccl_allreduce" ? profile_.nccl_allreduce_busbw_GBps
                                                   : profile_.nccl_alltoall_busbw_GBps;
  std::vector<uint64_t> sizes;
  for (const auto& r : rows) {
    uint64_t s = r["size"];
    if (std::find(sizes.begin(), sizes.end(), s) == sizes.end()) sizes.push_back(s);
  }
  std::sort(sizes.begin(), sizes.end());
  ReportTable t({{"size", "B"}, {"count", "elements"}, {"time", "us"}, {"algbw", "GB/s"}, {"busbw", "GB/s"},
                 {"wrong", ""}, {"limit", "GB/s"}, {"result", ""}, {"note", ""}});
  std::string last_error;
  for (uint64_t s : sizes) {
    double time = NAN;
    int64_t wrong = 0, count = 0;
    int reported = 0;
    std::string error;
    for (const auto& r : rows) {
      if (r["size"] != s) continue;
      ++reported;
      count = r.value("count", int64_t(0));
      double v = num(r, "value");
      if (std::isfinite(v)) time = std::isfinite(time) ? std::max(time, v) : v;
      if (r["wrong"].is_number()) wrong += r["wrong"].get<int64_t>();
      std::string e = r.value("error", "");
      if (!e.empty() && error.empty()) error = r["node"].get<std::string>() + ": " + e;
    }
    if (reported < n - static_cast<int>(silent_ranks.size()) || !silent_ranks.empty()) {
      if (error.empty()) error = "not every rank reported";
      time = NAN;
    } else if (!error.empty()) {
      time = NAN;
    }
    double algbw = static_cast<double>(s) / time / 1e9, busbw = algbw * busbw_factor(kind, n);
    bool last = s == sizes.back();
    std::string limit = "-", result = "-";
    // Relative limits for collectives compare busbw with the median MPI point-to-point bandwidth
    // of this allocation (busbw is defined to be comparable with a link's bandwidth).
    if (last && !th.empty()) {
      limit = th.describe(mpi_p2p_bw_median_);
      result = th.passes(busbw, mpi_p2p_bw_median_) ? "PASS" : "FAIL";
      if (th.relative && !std::isfinite(mpi_p2p_bw_median_))
        notes_.push_back(kind + ": relative limit not applied (no mpi_p2p bandwidth median in this run)");
    }
    if (wrong > 0 || !error.empty()) result = "FAIL";
    // One reason per distinct failure: the sizes after a timeout or a failed NCCL start repeat it.
    const bool repeated = !error.empty() && (error == last_error || error.find("not run after an earlier timeout") != std::string::npos);
    if (result == "FAIL" && !repeated)
      allocation_reasons_.push_back(kind + " at " + std::to_string(s) + " B: " +
                                    (!error.empty() ? error : wrong > 0 ? std::to_string(wrong) + " wrong elements"
                                                                        : "busbw " + fmt(busbw) + " GB/s (limit " + limit + ")"));
    if (!error.empty()) last_error = error;
    auto cell = [](double v) { return std::isfinite(v) ? ReportTable::Cell(v) : ReportTable::Cell(std::monostate{}); };
    t.add_row({static_cast<int64_t>(s), count, cell(time * 1e6), cell(algbw), cell(busbw),
               static_cast<int64_t>(wrong), limit, result, error});
  }
  checks_[kind] = {{"rows", t.json()}, {"busbw_factor", busbw_factor(kind, n)}};
  return t.text();
}

void Evaluation::add_silent(const std::string& check, const std::vector<int>& ranks, double waited_s) {
  for (int r : ranks) {
    const std::string& node = nodes_[static_cast<size_t>(r)];
    reasons_[node].push_back(check + ": stopped responding (no report within " + fmt(waited_s, 0) +
                             " s; hung or dead)");
    silent_.push_back({{"rank", r}, {"node", node}, {"check", check}});
  }
}

void Evaluation::add_not_run(const std::string& check, const std::string& why, bool is_failure) {
  checks_[check] = {{"rows", nlohmann::json::array()}, {"not_run", why}};
  if (is_failure) allocation_reasons_.push_back(check + ": " + why);
  else notes_.push_back(check + " not run: " + why);
}

bool Evaluation::healthy() const { return failures().empty(); }

std::vector<std::string> Evaluation::unhealthy_nodes() const {
  std::vector<std::string> out;
  for (const auto& n : nodes_)
    if (!reasons_.at(n).empty()) out.push_back(n);
  return out;
}

std::string Evaluation::drain_reason(const std::string& node) const {
  std::string r = reasons_.at(node).empty() ? "failed" : reasons_.at(node).front();
  for (char& c : r)
    if (c == '"' || c == '\'' || c == '\n' || c == '\\' || c == '$' || c == '`') c = ' ';
  if (r.size() > 200) r = r.substr(0, 197) + "...";
  return r;
}

ReportTable Evaluation::verdict_table() const {
  ReportTable t({{"node", ""}, {"verdict", ""}, {"reasons", ""}});
  for (const auto& n : nodes_) {
    const auto& rs = reasons_.at(n);
    std::string joined;
    for (const auto& r : rs) joined += (joined.empty() ? "" : "; ") + r;
    t.add_row({n, rs.empty() ? "healthy" : "UNHEALTHY", joined.empty() ? "-" : joined});
  }
  std::string joined;
  for (const auto& r : allocation_reasons_) joined += (joined.empty() ? "" : "; ") + r;
  t.add_row({"allocation", allocation_reasons_.empty() ? "healthy" : "UNHEALTHY", joined.empty() ? "-" : joined});
  return t;
}

std::vector<std::string> Evaluation::failures() const {
  std::vector<std::string> f;
  for (const auto& n : nodes_)
    if (!reasons_.at(n).empty()) f.push_back(n + ": " + reasons_.at(n).front());
  if (!allocation_reasons_.empty()) f.push_back("allocation: " + allocation_reasons_.front());
  return f;
}

std::string Evaluation::verdict_text() const {
  std::string out = "# verdict per node\n" + verdict_table().text();
  for (const auto& n : notes_) out += "# note: " + n + "\n";
  return out + summary_footer(nodes_.size() + 1, failures());
}

nlohmann::json Evaluation::json(const nlohmann::json& provenance, const std::string& mode, int exit_code) const {
  nlohmann::json j;
  j["provenance"] = provenance;
  j["profile"] = {{"name", profile_.name}, {"file", profile_.file}};
  j["mode"] = mode;
  j["nodes"] = nodes_;
  j["checks"] = checks_;
  j["verdict"] = verdict_table().json();
  j["unhealthy_nodes"] = unhealthy_nodes();
  j["allocation_failures"] = allocation_reasons_;
  j["silent"] = silent_;
  j["notes"] = notes_;
  j["result"] = healthy() ? "healthy" : "unhealthy";
  j["exit_code"] = exit_code;
  return j;
}

}  // namespace hpct::healthcheck
