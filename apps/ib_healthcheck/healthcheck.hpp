// The ib_healthcheck driver: runs the selected checks in order, gathers each check's rows on
// rank 0 through the control channel, prints a table per check as it completes, then the verdict,
// the JSON twin, the exclude list and the drain commands.
#pragma once
#include "fabric.hpp"
#include "options.hpp"
#include "profile.hpp"

namespace hpct::healthcheck {

/// Options that override the profile (sizes, timeout, rounds) are folded into it here; throws
/// hpct::Error for combinations that cannot run.
void apply_overrides(const Options& o, Profile& p);

/// The checks this run performs, in order: the ones asked for with -c, or all (the nccl_ ones only
/// when the profile expects GPUs).
std::vector<std::string> selected_checks(const Options& o, const Profile& p);

/// Collective over MPI_COMM_WORLD (one rank per node). Returns the exit code (same on every rank).
/// When a rank stopped responding or an operation timed out, rank 0 reports and then ends the job
/// with MPI_Abort(exit code): Open MPI cannot finalize beside a hung rank. Never returns then.
int run_allocation(const Options& o, const Profile& p);

/// Node-local checks of this node only, without MPI (Slurm's HealthCheckProgram).
int run_node_local(const Options& o, const Profile& p);

}  // namespace hpct::healthcheck
