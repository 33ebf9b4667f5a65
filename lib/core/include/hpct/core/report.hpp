// hpct/core/report.hpp — the shared output of hpctrain's benchmark and check apps (nvme_bench,
// ib_healthcheck): a '#'-prefixed provenance header, a header row and a units row, one row per
// case, a summary footer with OK/FAILED, and a JSON twin with the same fields; plus a progress
// line with ETA for long runs.
//
// It is not a logging framework: it formats, the app decides which rank prints. Tables are kept
// in memory (a benchmark has tens to thousands of rows, not millions), so the JSON twin is exact.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace hpct {

/// Version of hpctrain and the git commit it was configured from ("unknown" outside a checkout).
const char* hpct_version();
const char* hpct_git_sha();
/// Every app's --version: when an argument is exactly --version, prints "PROG (hpctrain VERSION,
/// git SHA)" to stdout and returns true (the app then exits 0 before starting anything).
bool print_version_if_asked(const char* prog, int argc, char** argv);

/// "# key: value" lines: tool, version, git, date (UTC), host, then the caller's fields in order.
/// The same fields go into the JSON twin under "provenance".
class Provenance {
 public:
  explicit Provenance(std::string tool);
  Provenance& add(const std::string& key, const std::string& value);
  std::string text() const;
  nlohmann::json json() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

/// A table of cases. A cell is text, an integer or a number printed with the column's precision;
/// a missing value (e.g. a percentile not measured) is std::monostate, printed "-" and JSON null.
class ReportTable {
 public:
  using Cell = std::variant<std::monostate, std::string, int64_t, double>;
  struct Column {
    std::string name;   // header and JSON key, snake_case
    std::string unit;   // units row ("MB/s", "us", "" for none)
    int precision = 2;  // digits after the point for doubles
  };

  explicit ReportTable(std::vector<Column> columns);
  /// Adds a row; its size must equal the number of columns.
  void add_row(std::vector<Cell> row);

  const std::vector<Column>& columns() const { return columns_; }
  size_t size() const { return rows_.size(); }
  const std::vector<Cell>& row(size_t i) const { return rows_.at(i); }

  /// Header row and units row ("#"-prefixed units row so the table stays parseable).
  std::string header_text() const;
  /// One formatted row, aligned with header_text().
  std::string row_text(size_t i) const;
  /// Everything: header, units, all rows.
  std::string text() const;
  /// [{column: value, ...}, ...]
  nlohmann::json json() const;

 private:
  std::string cell_text(const Cell& c, const Column& col) const;
  size_t width(size_t col) const;
  std::vector<Column> columns_;
  std::vector<std::vector<Cell>> rows_;
};

/// "# Result: OK (12 cases)" or "# Result: FAILED (2 of 12 cases: reason; reason)".
std::string summary_footer(size_t cases, const std::vector<std::string>& failures);

/// A progress line for long runs: "[ 3/12] <label> elapsed 14 s, ETA 42 s". The ETA assumes the
/// remaining cases cost what the finished ones did on average (or what the caller weights them).
class Progress {
 public:
  /// total_cases: how many done() calls to expect. total_weight: the sum of the cases' weights
  /// (e.g. bytes each case moves); 0 means every case weighs 1.
  explicit Progress(int total_cases, double total_weight = 0, std::FILE* out = stderr);
  /// Call after finishing a case of the given weight; prints one line (when out is non-null).
  void done(const std::string& label, double weight = 1.0);
  double elapsed_seconds() const;
  double eta_seconds() const;

 private:
  int total_cases_ = 0, count_ = 0;
  double total_ = 0, finished_ = 0;
  double start_;
  std::FILE* out_;
};

/// Writes text to a file atomically (temp file + rename), so a reader (or a crash) sees the old
/// file or the new one, never half of one. Throws hpct::Error naming the file.
void write_file_atomic(const std::string& path, const std::string& text);
/// The JSON's text (indent < 0: one line). A string that is not valid UTF-8 (byte-level BPE cuts
/// characters; a path may hold any byte) is written with U+FFFD for each invalid byte instead of
/// failing: every JSON hpctrain writes goes through here.
std::string json_text(const nlohmann::json& doc, int indent = -1);
/// write_file_atomic of the JSON, pretty-printed (json_text).
void write_json_file(const std::string& path, const nlohmann::json& doc);

}  // namespace hpct
