#include "hpct/core/sysinfo.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace hpct {
namespace {
uint64_t status_kb(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  std::string prefix = std::string(field) + ":";
  while (std::getline(f, line)) {
    if (line.compare(0, prefix.size(), prefix) == 0) {
      std::istringstream is(line.substr(prefix.size()));
      uint64_t kb = 0;
      is >> kb;
      return kb;
    }
  }
  return 0;
}
}  // namespace

uint64_t current_rss_bytes() { return status_kb("VmRSS") * 1024; }
uint64_t peak_rss_bytes() { return status_kb("VmHWM") * 1024; }

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string node_name() {
  if (const char* s = std::getenv("SLURMD_NODENAME"); s && *s) return s;
  return host_name();
}
}  // namespace hpct
