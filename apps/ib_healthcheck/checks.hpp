// The fabric check plug-ins. Each runs this rank's part of one check and returns its raw rows
// (JSON objects) for rank 0 to judge; none of them decides PASS/FAIL (evaluate.cpp does, with the
// whole allocation's figures in hand, since thresholds may be relative to the median).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fabric.hpp"
#include "hpct/core/report.hpp"

namespace hpct::healthcheck {

struct P2pConfig {
  uint64_t lat_size = 8, bw_size = 4u << 20;
  int lat_iters = 1000, bw_iters = 20, window = 16;
};

/// Point-to-point probes over t for this rank's pairs in every round: latency (median half
/// round-trip of lat_size ping-pongs), bandwidth each way and bidirectional at bw_size (OSU's
/// window scheme), after a verified exchange. Rows are owned by the side that measured them.
/// Sets timed_out when a wait gave up (the rest of this rank's pairs are then abandoned).
/// progress (rank 0 only) gets one done() per round.
nlohmann::json run_p2p(FabricContext& ctx, PairTransport& t, const std::string& check, const P2pConfig& cfg,
                       const std::vector<std::vector<int>>& rounds, Progress* progress, bool& timed_out);

/// The rows each pair should yield, with their owner rank: for the evaluation to notice missing ones.
struct ExpectedRow {
  std::string metric, subject;
  int owner;
  int a, b;  // ranks of the pair (a measured from, b the partner)
};
std::vector<ExpectedRow> expected_p2p_rows(const std::vector<std::vector<int>>& rounds,
                                           const std::vector<std::string>& nodes);

/// "allreduce" (float sum, NCCL's ring over MPI point-to-point: hpct::comm::RingAllreduce) or
/// "alltoall" (MPI_Ialltoall, float) on host buffers,
/// or "nccl_allreduce" / "nccl_alltoall" on device buffers (NCCL, one GPU per rank), over every
/// size, verified first, then timed; each rank reports its time per operation.
nlohmann::json run_collective(FabricContext& ctx, const std::string& kind, const std::vector<uint64_t>& sizes,
                              int max_iters, Progress* progress, bool& timed_out);

/// Progress weights (bytes moved), so the ETA of a sweep is not thrown off by its big sizes.
double p2p_round_weight(const P2pConfig& cfg);
int collective_iters(uint64_t bytes, int max_iters);
double collective_weight(uint64_t bytes, int max_iters);

/// Sizes from lo to hi, doubling (hi included even when not a power-of-two step from lo).
std::vector<uint64_t> size_sweep(uint64_t lo, uint64_t hi);
/// The collective checks (MPI and NCCL).
bool is_collective(const std::string& check);
/// nccl-tests' bus bandwidth factor: allreduce 2(n-1)/n, alltoall (n-1)/n.
double busbw_factor(const std::string& kind, int n);
/// Bytes a collective case of nominal size moves per rank as nccl-tests counts them (alltoall
/// rounds down to a whole float per peer, at least one).
uint64_t collective_bytes(const std::string& kind, uint64_t size, int n);

}  // namespace hpct::healthcheck
