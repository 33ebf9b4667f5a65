// hpct/core/sysinfo.hpp — what the process holds: resident and peak resident memory, host name.
// Memory is read from /proc/self/status (VmRSS, VmHWM), i.e. measured, never estimated.
#pragma once
#include <cstdint>
#include <string>

namespace hpct {
uint64_t current_rss_bytes();
uint64_t peak_rss_bytes();
std::string host_name();
/// Slurm's node name when running under slurmd (SLURMD_NODENAME), else the host name.
std::string node_name();
}  // namespace hpct
