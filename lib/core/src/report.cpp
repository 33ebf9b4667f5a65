// Shared benchmark/check report: provenance, aligned tables, footer, progress, atomic JSON.
#include "hpct/core/report.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "hpct/core/error.hpp"
#include "hpct/core/file.hpp"
#include "hpct/core/sysinfo.hpp"

#ifndef HPCT_VERSION
#define HPCT_VERSION "unknown"
#endif

namespace hpct {

namespace detail {
extern const char* const kGitSha;  // the build's generated git_sha.cpp (cmake/GitSha.cmake)
}

const char* hpct_version() { return HPCT_VERSION; }
const char* hpct_git_sha() { return detail::kGitSha; }

bool print_version_if_asked(const char* prog, int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--version") {
      std::printf("%s (hpctrain %s, git %s)\n", prog, HPCT_VERSION, detail::kGitSha);
      return true;
    }
  return false;
}

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}
std::string fmt_seconds(double s) {
  char buf[32];
  if (s < 120) std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s < 7200) std::snprintf(buf, sizeof buf, "%.1f min", s / 60);
  else std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  return buf;
}
}  // namespace

Provenance::Provenance(std::string tool) {
  fields_ = {{"tool", std::move(tool)},
             {"version", hpct_version()},
             {"git", hpct_git_sha()},
             {"date", utc_now()},
             {"host", host_name()}};
}

Provenance& Provenance::add(const std::string& key, const std::string& value) {
  fields_.emplace_back(key, value);
  return *this;
}

std::string Provenance::text() const {
  std::string out;
  for (const auto& [k, v] : fields_) out += "# " + k + ": " + v + "\n";
  return out;
}

nlohmann::json Provenance::json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : fields_) j[k] = v;
  return j;
}

ReportTable::ReportTable(std::vector<Column> columns) : columns_(std::move(columns)) {
  HPCT_REQUIRE(!columns_.empty(), "ReportTable needs at least one column");
}

void ReportTable::add_row(std::vector<Cell> row) {
  if (row.size() != columns_.size())
    throw Error("ReportTable::add_row: row has " + std::to_string(row.size()) + " cells, table has " +
                std::to_string(columns_.size()) + " columns");
  rows_.push_back(std::move(row));
}

std::string ReportTable::cell_text(const Cell& c, const Column& col) const {
  if (std::holds_alternative<std::monostate>(c)) return "-";
  if (const auto* s = std::get_if<std::string>(&c)) return *s;
  if (const auto* i = std::get_if<int64_t>(&c)) return std::to_string(*i);
  double v = std::get<double>(c);
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", col.precision, v);
  return buf;
}

size_t ReportTable::width(size_t col) const {
  size_t w = std::max(columns_[col].name.size(), columns_[col].unit.size());
  for (const auto& r : rows_) w = std::max(w, cell_text(r[col], columns_[col]).size());
  return w;
}

std::string ReportTable::header_text() const {
  std::string names = " ", units = "#";
  for (size_t c = 0; c < columns_.size(); ++c) {
    size_t w = width(c);
    char buf[256];
    std::snprintf(buf, sizeof buf, " %*s", static_cast<int>(w), columns_[c].name.c_str());
    names += buf;
    std::snprintf(buf, sizeof buf, " %*s", static_cast<int>(w), columns_[c].unit.c_str());
    units += buf;
  }
  return names + "\n" + units + "\n";
}

std::string ReportTable::row_text(size_t i) const {
  std::string out = " ";
  const auto& r = rows_.at(i);
  for (size_t c = 0; c < columns_.size(); ++c) {
    std::string t = cell_text(r[c], columns_[c]);
    size_t w = width(c);
    out += " " + std::string(w > t.size() ? w - t.size() : 0, ' ') + t;
  }
  return out + "\n";
}

std::string ReportTable::text() const {
  std::string out = header_text();
  for (size_t i = 0; i < rows_.size(); ++i) out += row_text(i);
  return out;
}

nlohmann::json ReportTable::json() const {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& r : rows_) {
    nlohmann::json o = nlohmann::json::object();
    for (size_t c = 0; c < columns_.size(); ++c) {
      const Cell& cell = r[c];
      const std::string& k = columns_[c].name;
      if (std::holds_alternative<std::monostate>(cell)) o[k] = nullptr;
      else if (const auto* s = std::get_if<std::string>(&cell)) o[k] = *s;
      else if (const auto* i = std::get_if<int64_t>(&cell)) o[k] = *i;
      else {
        double v = std::get<double>(cell);
        if (std::isfinite(v)) o[k] = v;
        else o[k] = nullptr;
      }
    }
    arr.push_back(std::move(o));
  }
  return arr;
}

std::string summary_footer(size_t cases, const std::vector<std::string>& failures) {
  if (failures.empty()) return "# Result: OK (" + std::to_string(cases) + " cases)\n";
  std::string out = "# Result: FAILED (" + std::to_string(failures.size()) + " of " + std::to_string(cases) +
                    " cases: ";
  for (size_t i = 0; i < failures.size(); ++i) out += (i ? "; " : "") + failures[i];
  return out + ")\n";
}

Progress::Progress(int total_cases, double total_weight, std::FILE* out)
    : total_cases_(total_cases),
      total_(total_weight > 0 ? total_weight : total_cases),
      start_(now_seconds()),
      out_(out) {}

double Progress::elapsed_seconds() const { return now_seconds() - start_; }

double Progress::eta_seconds() const {
  if (finished_ <= 0) return 0;
  return std::max(0.0, elapsed_seconds() / finished_ * (total_ - finished_));
}

void Progress::done(const std::string& label, double weight) {
  ++count_;
  finished_ += weight;
  if (!out_) return;
  int digits = static_cast<int>(std::to_string(total_cases_).size());
  std::fprintf(out_, "[%*d/%d] %s  elapsed %s, ETA %s\n", digits, count_, total_cases_, label.c_str(),
               fmt_seconds(elapsed_seconds()).c_str(), fmt_seconds(eta_seconds()).c_str());
  std::fflush(out_);
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, [&](std::FILE* f) { std::fwrite(text.data(), 1, text.size(), f); });
}

std::string json_text(const nlohmann::json& doc, int indent) {
  return doc.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

void write_json_file(const std::string& path, const nlohmann::json& doc) { write_file_atomic(path, json_text(doc, 2) + "\n"); }

}  // namespace hpct
