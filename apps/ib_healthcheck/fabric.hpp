// The fabric side of ib_healthcheck: who talks to whom (round-robin pairings), how (a transport
// over MPI or UCX with deadline waits), and how results reach rank 0 when a rank may be hung (a
// control communicator, point-to-point only, with deadlines). The check plug-ins (p2p.cpp,
// collectives.cpp) use only this.
//
// Failure model: a rank that stops answering is detected by its silence on the control channel,
// never by waiting on it; pending operations with it are left behind, and rank 0 reports and then
// ends the job with MPI_Abort (Open MPI 4.1 cannot finalize beside a hung rank).
#pragma once
#include <mpi.h>

#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hpct/comm/deadline.hpp"
#include "hpct/core/error.hpp"
#include "options.hpp"

namespace hpct::healthcheck {

/// Thrown when a rank we depend on (rank 0, or anyone at the start) went silent: the job ends as
/// unhealthy (exit 1) rather than "could not run".
class SilentPeer : public Error {
 public:
  using Error::Error;
};

struct FabricContext {
  MPI_Comm world = MPI_COMM_NULL;  // the job (ib_healthcheck runs one rank per node)
  MPI_Comm ctl = MPI_COMM_NULL;    // control: results and decisions, never measurements
  MPI_Comm data = MPI_COMM_NULL;   // measurements of the current check (a fresh MPI_Comm_idup each)
  int rank = 0, size = 1;
  int local_rank = 0;              // among the ranks on this host (picks the GPU of NCCL checks)
  std::vector<std::string> nodes;  // node name per rank
  double timeout_s = 30;
  comm::PollPolicy poll;
  std::vector<Fault> faults;
  bool quiet = false;

  double deadline() const { return comm::steady_seconds() + timeout_s; }
  /// The fault injected on this rank for this check, if any.
  const Fault* fault(const std::string& check) const;
  /// Applies a hang or die fault at its injection point (never returns for those).
  void maybe_stop(const std::string& check) const;
};

/// Round-robin ("circle method") pairings: result[r][i] is rank i's partner in round r, or -1 when
/// i sits out (odd n). Every round is a perfect matching and no pair repeats, so `rounds` rounds
/// give each rank `rounds` distinct partners; n-1 rounds (n even) cover every pair. rounds is
/// capped at n-1 (n even) or n (n odd).
std::vector<std::vector<int>> pairings(int n, int rounds);

/// Nonblocking point-to-point with deadline waits, over MPI or UCX; the p2p probes are written once
/// against this. Tags are small integers (< 2^16) naming the step.
class PairTransport {
 public:
  virtual ~PairTransport() = default;
  virtual std::string name() const = 0;
  virtual void send(int peer, const void* buf, size_t n, int tag) = 0;
  virtual void recv(int peer, void* buf, size_t n, int tag) = 0;
  /// Waits for every operation posted since the last successful wait; false at the deadline
  /// (operations stay pending; their buffers must outlive the job).
  virtual bool wait(double deadline) = 0;
  /// Blocking send and receive for the timed latency batches, which must cost what the reference
  /// tools' loops cost. They cannot time out: callers guard them with comm::AlarmGuard. Only MPI
  /// offers them (Open MPI 4.1's pollable receive costs 20-50 ns more per message on shared memory;
  /// UCX's tools poll too); the others throw.
  virtual bool offers_blocking() const { return false; }
  virtual void send_blocking(int /*peer*/, const void* /*buf*/, size_t /*n*/, int /*tag*/) {
    throw Error(name() + " transport has no blocking send");
  }
  virtual void recv_blocking(int /*peer*/, void* /*buf*/, size_t /*n*/, int /*tag*/) {
    throw Error(name() + " transport has no blocking receive");
  }
};

std::unique_ptr<PairTransport> make_mpi_transport(const FabricContext& ctx);
/// Builds UCP endpoints to every peer; worker addresses travel over ctx.data (Iallgatherv with a
/// deadline). Throws hpct::Error when UCX is missing or fails to start on this rank; returns null
/// (and sets why) when the exchange timed out or some peer has no UCX.
std::unique_ptr<PairTransport> make_ucx_transport(const FabricContext& ctx, std::string& why);

/// Outcome of a phase barrier on the control channel.
struct PhaseSync {
  bool go = true;                                  // every rank reported and nothing timed out
  std::vector<std::optional<nlohmann::json>> reports;  // rank 0 only: each rank's report (or none)
  std::vector<int> silent;                         // rank 0 only: ranks that did not report
};

/// Collective over ctx.ctl, deadline-bounded: every rank sends `mine` (an object with "rows" and
/// "timed_out") to rank 0, which waits at most wait_s for the others and answers go/stop. A rank
/// that hears nothing back from rank 0 within its own bound throws hpct::Error naming rank 0.
PhaseSync sync_phase(FabricContext& ctx, int phase, const nlohmann::json& mine, double wait_s);

/// Collective over ctx.world, deadline-bounded: a fresh communicator for the next check's data.
/// False when it timed out (some rank is not there).
bool fresh_data_comm(FabricContext& ctx);

/// Pattern for verifiable data (nccl-tests' idea): byte i of rank r's message in step s.
inline unsigned char pattern_byte(int rank, int step, size_t i) {
  return static_cast<unsigned char>((i * 131u + static_cast<size_t>(rank) * 29u + static_cast<size_t>(step) * 7u) & 0xffu);
}
void fill_pattern(unsigned char* buf, size_t n, int rank, int step);
size_t count_wrong(const unsigned char* buf, size_t n, int rank, int step);

/// Applies the slow fault's extra time: sleeps (factor - 1) x seconds when f is a slow fault.
void slow_down(const Fault* f, double seconds);

}  // namespace hpct::healthcheck
