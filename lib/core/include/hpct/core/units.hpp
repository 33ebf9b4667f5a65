// hpct/core/units.hpp — sizes with suffixes ("128K", "8G", "1e9") and human-readable bytes.
// Binary suffixes (K = 1024) as fio and DeepSpeed's aio knobs use them; plain numbers may use
// scientific notation as ds_config values do (5e8).
#pragma once
#include <cstdint>
#include <string>

namespace hpct {
/// Parses "4096", "128K", "1M", "8G", "1T", "5e8". Throws config_error(key, ...) on bad input.
uint64_t parse_size(const std::string& text, const std::string& key);
/// 1536 -> "1.50 KiB"
std::string format_bytes(double bytes);
/// Exact, in the flags' own notation, so parse_size reads it back: 1048576 -> "1M",
/// 1052672 -> "1028K", 6000 -> "6000".
std::string format_size(uint64_t bytes);
}  // namespace hpct
