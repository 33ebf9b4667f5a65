// Deadline-bounded MPI waits (see deadline.hpp for why nothing is cancelled on a timeout).
#include "hpct/comm/deadline.hpp"

#include <sched.h>

#include <chrono>

#include "hpct/comm/mpi.hpp"

namespace hpct::comm {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool wait_all_until(MPI_Request* reqs, int n, double deadline, PollPolicy policy) {
  // Reading the clock costs ~20 ns; MPI_Testall on shared memory ~50 ns. Check the clock every
  // 64 polls so a ping-pong's latency is not dominated by the deadline bookkeeping.
  for (unsigned spin = 0;; ++spin) {
    int flag = 0;
    HPCT_CHECK_MPI(MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE));
    if (flag) return true;
    if (policy.yield) sched_yield();
    if ((spin & 63u) == 63u && steady_seconds() > deadline) return false;
  }
}

void isend_string(const std::string& s, int dest, int tag, MPI_Comm comm, std::string& keep, MPI_Request* req) {
  keep = s;
  HPCT_CHECK_MPI(MPI_Isend(keep.data(), static_cast<int>(keep.size()), MPI_BYTE, dest, tag, comm, req));
}

bool recv_string_until(std::string& out, int source, int tag, MPI_Comm comm, double deadline, PollPolicy policy) {
  MPI_Status st;
  for (unsigned spin = 0;; ++spin) {
    int flag = 0;
    HPCT_CHECK_MPI(MPI_Iprobe(source, tag, comm, &flag, &st));
    if (flag) break;
    if (policy.yield) sched_yield();
    if ((spin & 63u) == 63u && steady_seconds() > deadline) return false;
  }
  int count = 0;
  MPI_Get_count(&st, MPI_BYTE, &count);
  std::string buf(static_cast<size_t>(count), '\0');
  // The message is already matched by the probe's envelope; MPI_Recv returns once the bytes land,
  // which for a sender that is alive enough to have sent the envelope is bounded.
  MPI_Request r;
  HPCT_CHECK_MPI(MPI_Irecv(buf.data(), count, MPI_BYTE, st.MPI_SOURCE, tag, comm, &r));
  if (!wait_all_until(&r, 1, deadline + 5.0, policy)) return false;
  out = std::move(buf);
  return true;
}

}  // namespace hpct::comm
