// Size parsing shared by every app's flags and the JSON configs.
#include "hpct/core/units.hpp"

#include <cmath>
#include <cstdio>

#include "hpct/core/error.hpp"

namespace hpct {

uint64_t parse_size(const std::string& text, const std::string& key) {
  if (text.empty()) throw config_error(key, "empty size", "write e.g. 1M, 128K or 4096");
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw config_error(key, "'" + text + "' is not a size", "write e.g. 1M, 128K or 4096");
  }
  std::string suffix = text.substr(pos);
  double mult = 1;
  if (suffix.empty() || suffix == "B") mult = 1;
  else if (suffix == "K" || suffix == "k" || suffix == "KiB" || suffix == "KB") mult = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB" || suffix == "MB") mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB" || suffix == "GB") mult = 1024.0 * 1024 * 1024;
  else if (suffix == "T" || suffix == "t" || suffix == "TiB" || suffix == "TB") mult = 1024.0 * 1024 * 1024 * 1024;
  else throw config_error(key, "'" + text + "' has an unknown size suffix '" + suffix + "'", "use K, M, G or T");
  double bytes = value * mult;
  if (!(bytes >= 0) || bytes > 1.8e19 || std::floor(bytes) != bytes)
    throw config_error(key, "'" + text + "' is not a whole, non-negative number of bytes");
  return static_cast<uint64_t>(bytes);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

std::string format_size(uint64_t bytes) {
  const char suffix[] = {'T', 'G', 'M', 'K'};
  for (int i = 0; i < 4; ++i) {
    const uint64_t unit = uint64_t{1} << (10 * (4 - i));
    if (bytes >= unit && bytes % unit == 0) return std::to_string(bytes / unit) + suffix[i];
  }
  return std::to_string(bytes);
}

}  // namespace hpct
