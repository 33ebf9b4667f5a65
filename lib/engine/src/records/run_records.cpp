// Metrics file, TensorBoard and CSV records of a run, across its segments. See run_records.hpp.
#include "hpct/engine/records/run_records.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>

#include "hpct/core/error.hpp"
#include "hpct/core/report.hpp"
#include "hpct/io/tfevents.hpp"

namespace hpct::engine {
namespace fs = std::filesystem;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

void replace_file(const std::string& path, const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  write_file_atomic(path, text);
}

// A record belongs to the history up to iteration R?
bool keep_record(const std::string& line, long long R) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return false;
  auto number = [&](const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<long long>() : -1; };
  const std::string type = j["type"];
  if (type == "train" || type == "eval") return number("iteration") >= 0 && number("iteration") <= R;
  if (type == "summary") return number("iterations") >= 0 && number("iterations") <= R;
  if (type == "segment") return number("resumed_from_iteration") >= 0 && number("resumed_from_iteration") <= R;
  return false;
}

std::string csv_name(const std::string& tag) {  // DeepSpeed's csv_monitor: '/' and ' ' become '_'
  std::string s = tag;
  for (char& c : s)
    if (c == '/' || c == ' ') c = '_';
  return s + ".csv";
}

}  // namespace

long long trim_metrics_file(const std::string& path, long long R, const std::string& discarded_path) {
  std::ifstream in(path);
  if (!in) return 0;  // no history yet
  std::vector<std::string> kept, dropped;
  std::string line;
  bool newline_at_end = true;  // a writer killed mid-line leaves none: then the file is rewritten too
  while (std::getline(in, line)) {
    newline_at_end = !in.eof();
    if (line.empty()) continue;
    (keep_record(line, R) ? kept : dropped).push_back(line);
  }
  if (in.bad()) throw file_error(path, "cannot read the metrics file");
  if (dropped.empty()) {
    if (!newline_at_end) replace_file(path, kept);
    return 0;
  }
  {  // the dropped records first (appended, flushed), then the rewrite: a crash in between loses nothing
    // O_NOFOLLOW: a symbolic link planted at the name is refused, not appended through.
    const int fd = ::open(discarded_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    std::FILE* d = fd >= 0 ? ::fdopen(fd, "a") : nullptr;
    if (!d) {
      if (fd >= 0) ::close(fd);
      throw file_error(discarded_path, std::string("cannot write the discarded records: ") + std::strerror(errno),
                       "nothing was changed in " + path);
    }
    for (const auto& l : dropped) std::fprintf(d, "%s\n", l.c_str());
    const bool ok = std::fflush(d) == 0 && !std::ferror(d);
    if (std::fclose(d) != 0 || !ok)
      throw file_error(discarded_path, "cannot write the discarded records (disk full?)", "nothing was changed in " + path);
  }
  replace_file(path, kept);
  return static_cast<long long>(dropped.size());
}

RunRecorder::RunRecorder(const TrainConfig& cfg, bool root) : cfg_(cfg.records), metrics_path_(cfg.metrics_file), root_(root) {}

RunRecorder::~RunRecorder() = default;

void RunRecorder::begin_segment(const SegmentInfo& info) {
  if (!root_) return;
  const double wall = now_seconds();
  provenance_ = {{"app", info.app},
                 {"version", hpct_version()},
                 {"git_commit", hpct_git_sha()},
                 {"time", utc_now()},
                 {"resumed_from_iteration", info.resumed_from},
                 {"checkpoint", info.checkpoint.empty() ? nlohmann::json(nullptr) : nlohmann::json(info.checkpoint)},
                 {"hosts", info.hosts},
                 {"layout", info.layout},
                 {"config", info.config}};
  if (info.evaluation_only && !metrics_path_.empty() && fs::exists(metrics_path_) && fs::file_size(metrics_path_) > 0)
    throw file_error(metrics_path_, "--skip-train would append an evaluation to a file that holds a run's history",
                     "give --skip-train a new --metrics-file (the training run's records stay as they are)");
  provenance_["evaluation_only"] = info.evaluation_only;
  if (!metrics_path_.empty()) {
    const std::string discarded = metrics_path_ + ".discarded";
    const long long dropped = info.evaluation_only ? 0 : trim_metrics_file(metrics_path_, info.resumed_from, discarded);
    long long segments = 0;
    {
      std::ifstream in(metrics_path_);
      std::string line;
      while (std::getline(in, line)) segments += line.find("\"type\":\"segment\"") != std::string::npos;
    }
    metrics_.open(metrics_path_, std::ios::app);
    if (!metrics_) throw file_error(metrics_path_, "cannot write the metrics file");
    nlohmann::json seg = {{"type", "segment"}, {"segment", segments + 1}, {"wall_time", wall}};
    seg.update(provenance_);
    seg["discarded_records"] = dropped;
    seg["discarded_file"] = dropped ? nlohmann::json(discarded) : nlohmann::json(nullptr);
    metrics_ << json_text(seg) << "\n" << std::flush;
    provenance_["segment"] = segments + 1;
  }
  if (info.evaluation_only) {
    cfg_.csv_dir.clear();
    return;
  }
  if (!cfg_.tensorboard_dir.empty()) {
    events_ = std::make_unique<io::EventFileWriter>(cfg_.tensorboard_dir, wall);
    // TensorBoard drops what earlier files hold at steps > resumed_from (a fresh start: all of it).
    events_->session_start(info.resumed_from + 1, wall,
                           info.resumed_from ? "resumed from iteration " + std::to_string(info.resumed_from) : "start");
    events_->flush();
  }
  if (!cfg_.csv_dir.empty()) {
    std::error_code ec;
    fs::create_directories(cfg_.csv_dir, ec);
    if (ec) throw file_error(cfg_.csv_dir, "cannot create the CSV directory: " + ec.message());
    trim_csv(info.resumed_from);
  }
}

void RunRecorder::trim_csv(long long R) {
  for (const auto& e : fs::directory_iterator(cfg_.csv_dir)) {
    if (e.path().extension() != ".csv") continue;
    std::ifstream in(e.path());
    std::vector<std::string> kept;
    std::string line;
    bool changed = false;
    while (std::getline(in, line)) {
      if (kept.empty()) {  // the header
        kept.push_back(line);
        continue;
      }
      char* end = nullptr;
      const long long step = std::strtoll(line.c_str(), &end, 10);
      if (end != line.c_str() && *end == ',' && step <= R) kept.push_back(line);
      else changed = true;
    }
    if (changed) replace_file(e.path().string(), kept);
  }
}

void RunRecorder::stop(const std::string& what, const std::string& why) {
  stopped_.push_back(what + ": " + why);
  std::fprintf(stderr, "warning: %s cannot be written (%s): its records stop here; training goes on\n", what.c_str(),
               why.c_str());
  std::fflush(stderr);
}

void RunRecorder::write_scalars(const std::vector<Scalar>& scalars) {
  if (events_) try {
    // One Event per run of scalars at the same step.
    const double wall = now_seconds();
    std::vector<std::pair<std::string, float>> v;
    for (size_t i = 0; i < scalars.size(); ++i) {
      if (std::isfinite(scalars[i].value)) v.emplace_back(scalars[i].tag, static_cast<float>(scalars[i].value));
      if (i + 1 == scalars.size() || scalars[i + 1].step != scalars[i].step) {
        events_->add_scalars(v, scalars[i].step, wall);
        v.clear();
      }
    }
  } catch (const Error& e) {
    events_.reset();
    stop("the TensorBoard event file in " + cfg_.tensorboard_dir, e.message());
  }
  if (!cfg_.csv_dir.empty() && !csv_stopped_) {
    for (const auto& s : scalars) {
      if (!std::isfinite(s.value)) continue;
      auto& f = csv_[s.tag];
      if (!f) {
        const std::string path = cfg_.csv_dir + "/" + csv_name(s.tag);
        const bool fresh = !fs::exists(path);
        f = std::make_unique<std::ofstream>(path, std::ios::app);
        if (!*f) {
          csv_.clear();
          csv_stopped_ = true;
          stop("the CSV file " + path, "cannot open it");
          break;
        }
        if (fresh) *f << "step," << s.tag.substr(s.tag.rfind('/') + 1) << "\n";
      }
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.9g", s.value);
      *f << s.step << "," << buf << "\n";
    }
  }
}

void RunRecorder::iteration(long long it, const std::vector<Scalar>& scalars) {
  if (!root_ || it % cfg_.tensorboard_log_interval != 0) return;
  write_scalars(scalars);
}

void RunRecorder::record(const nlohmann::json& rec, const std::vector<Scalar>& scalars) {
  if (!root_) return;
  if (metrics_.is_open()) {
    nlohmann::json r = rec;
    if (!r.contains("wall_time")) r["wall_time"] = now_seconds();
    metrics_ << json_text(r) << "\n";
  }
  write_scalars(scalars);
  flush();
}

void RunRecorder::flush() {
  if (!root_) return;
  if (metrics_.is_open()) {
    metrics_.flush();
    if (!metrics_) {
      metrics_.close();
      stop("the metrics file " + metrics_path_, "a write failed; disk full?");
    }
  }
  if (events_) try {
      events_->flush();
    } catch (const Error& e) {
      events_.reset();
      stop("the TensorBoard event file in " + cfg_.tensorboard_dir, e.message());
    }
  for (auto it = csv_.begin(); it != csv_.end();) {
    it->second->flush();
    if (*it->second) {
      ++it;
      continue;
    }
    const std::string tag = it->first;
    csv_.clear();
    csv_stopped_ = true;
    stop("the CSV file for " + tag + " in " + cfg_.csv_dir, "a write failed; disk full?");
    break;
  }
}

}  // namespace hpct::engine
