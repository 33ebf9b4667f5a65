// Judging and reporting: turns the raw rows of every check into tables with limits and PASS/FAIL,
// a verdict per node with its reasons, the JSON twin, the --exclude-file list and the drain
// commands. Rank 0 only; no MPI.
//
// Blame: a point-to-point failure is pinned on a node only when that node failed with more than
// half of its partners (so a slow node is told apart from its slow partner); a failed pair whose
// two nodes are otherwise fine is reported as a suspect link. Collective checks judge the
// allocation as a whole. A rank that stops answering is named by its silence, and the timeouts it
// caused on its partners in the same check are not held against them.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checks.hpp"
#include "hpct/core/report.hpp"
#include "profile.hpp"

namespace hpct::healthcheck {

class Evaluation {
 public:
  Evaluation(const Profile& profile, std::vector<std::string> nodes);

  /// Node-local rows (already PASS/FAIL/SKIP). Returns the check's table text.
  std::string add_node_rows(const nlohmann::json& rows);
  /// Point-to-point rows of all ranks for one transport's check ("mpi_p2p", "ucx_p2p").
  std::string add_p2p(const std::string& check, const nlohmann::json& rows, const std::vector<ExpectedRow>& expected,
                      const std::vector<int>& silent_ranks);
  /// Collective rows of all ranks ("allreduce", "alltoall").
  std::string add_collective(const std::string& kind, const nlohmann::json& rows, const std::vector<int>& silent_ranks);
  /// Ranks that did not report for a check (hung or dead).
  void add_silent(const std::string& check, const std::vector<int>& ranks, double waited_s);
  /// A check that was not run, and why (e.g. built without UCX, stopped after a failure).
  void add_not_run(const std::string& check, const std::string& why, bool is_failure);

  bool healthy() const;
  std::vector<std::string> unhealthy_nodes() const;
  /// The first reason for a node, for scontrol's Reason= (short, no quotes).
  std::string drain_reason(const std::string& node) const;
  /// Verdict table (one row per node, and "allocation") and the footer.
  std::string verdict_text() const;
  nlohmann::json json(const nlohmann::json& provenance, const std::string& mode, int exit_code) const;

 private:
  ReportTable verdict_table() const;
  std::vector<std::string> failures() const;
  const Profile& profile_;
  std::vector<std::string> nodes_;
  std::map<std::string, std::vector<std::string>> reasons_;  // node -> reasons
  std::vector<std::string> allocation_reasons_;
  std::vector<std::string> notes_;
  std::vector<nlohmann::json> silent_;
  nlohmann::json checks_ = nlohmann::json::object();
  double mpi_p2p_bw_median_ = NAN;  // reference for relative collective limits
};

}  // namespace hpct::healthcheck
