// Checks of a run's outputs before it trains (see run_outputs.hpp).
#include "hpct/engine/run_outputs.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "hpct/core/error.hpp"
#include "hpct/engine/checkpointer.hpp"

namespace hpct::engine {

namespace {

std::string real(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
}

std::string parent_of(const std::string& file) {
  auto slash = file.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : file.substr(0, slash);
}

void mkdirs(const std::string& dir, const char* flag) {
  std::string p;
  size_t i = 0;
  while (i <= dir.size()) {
    size_t j = dir.find('/', i);
    if (j == std::string::npos) j = dir.size();
    p = dir.substr(0, j);
    if (!p.empty() && ::mkdir(p.c_str(), 0755) != 0 && errno != EEXIST)
      throw config_error(flag, std::string(flag) + " " + dir + ": cannot create " + p + ": " + std::strerror(errno),
                         "choose a directory you can write");
    i = j + 1;
  }
}

void check_file_output(const std::string& file, const char* flag) {
  if (file.empty()) return;
  struct stat st {};
  if (::stat(file.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw config_error(flag, std::string(flag) + " " + file + " is a directory", "name a file");
  const std::string dir = parent_of(file);
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw config_error(flag, std::string(flag) + " " + file + ": the directory " + dir + " does not exist",
                       "create it first, or name a file in an existing directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw config_error(flag, std::string(flag) + " " + file + ": the directory " + dir + " cannot be written: " + std::strerror(errno));
}

}  // namespace

void check_run_outputs(const TrainConfig& cfg, const std::string& loaded) {
  check_file_output(cfg.json_summary, "--json");
  check_file_output(cfg.metrics_file, "--metrics-file");
  if (cfg.save_dir.empty()) return;
  const std::string& d = cfg.save_dir;
  struct stat st {};
  if (::stat(d.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    throw config_error("--save", "--save " + d + " is not a directory", "name a directory (checkpoints are iter_NNNNNNN.h5 files in it)");
  mkdirs(d, "--save");
  if (::access(d.c_str(), W_OK | X_OK) != 0)
    throw config_error("--save", "--save " + d + " cannot be written: " + std::strerror(errno), "choose a directory you can write");
  std::string newest = Checkpointer::newest_checkpoint_in(d);
  if (newest.empty() && ::stat((d + "/latest").c_str(), &st) == 0) newest = "latest";
  if (newest.empty()) return;
  const bool resumes_here = !loaded.empty() && real(parent_of(loaded)) == real(d);
  if (!resumes_here)
    throw config_error("--save", "--save " + d + " already holds checkpoints (" + newest + ") that this run" +
                                     (loaded.empty() ? " does not load" : " does not resume from (it loads " + loaded + ")") +
                                     ": its saves would overwrite them",
                       "add --load " + d + " to continue that run, or save to another directory");
}

}  // namespace hpct::engine
