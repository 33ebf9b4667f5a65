// Node-local checks: what this node has (CPU, memory, hugepages, IB/RoCE ports in sysfs and as UCX
// sees them, GPUs, free disk) against the profile's expectations. No MPI: the same code serves the
// allocation run and --node-local (Slurm's HealthCheckProgram).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "profile.hpp"

namespace hpct::healthcheck {

/// One InfiniBand/RoCE port as /sys/class/infiniband shows it.
struct IbPort {
  std::string device;      // mlx5_0
  int port = 0;
  std::string state;       // ACTIVE, DOWN, ... (from "4: ACTIVE")
  double rate_gbps = 0;    // from "200 Gb/sec (4X HDR)"
  std::string link_layer;  // InfiniBand, Ethernet
};
/// Reads every port under root (default /sys/class/infiniband); none when the directory is absent.
std::vector<IbPort> read_ib_ports(const std::string& root = "/sys/class/infiniband");

/// Runs every node-local check; returns rows {check:"node", node, item, value, expected, result, note}
/// with result PASS, FAIL or SKIP (not measurable in this build; never counts as a pass silently:
/// the note says why and the verdict lists it).
nlohmann::json run_node_checks(const Profile& p, const std::string& node);

}  // namespace hpct::healthcheck
