// hpct/comm/deadline.hpp — MPI waits that give up at a deadline instead of hanging.
//
// A health check must name a dead or hung peer, not join it: every wait here polls with MPI_Test*
// until the operations complete or a steady-clock deadline passes. What it is not: a fault-tolerant
// MPI. On a timeout the operations stay pending (MPI can cancel neither a send nor a collective),
// so the caller keeps the buffers alive, stops using the communicator for data, and ends the job
// with MPI_Abort once it has reported (Open MPI 4.1 cannot finalize beside a hung rank).
#pragma once
#include <mpi.h>

#include <string>

namespace hpct::comm {

/// Seconds on the steady clock (the time base of every deadline here).
double steady_seconds();

/// How a poll loop behaves while it waits: spin (lowest latency, one core per rank) or give the
/// core away between polls (sched_yield) when more ranks than cores share a host.
struct PollPolicy {
  bool yield = false;
};

/// Polls until all n requests complete (true) or deadline passes (false, requests left pending).
bool wait_all_until(MPI_Request* reqs, int n, double deadline, PollPolicy policy = {});

/// Starts sending s to dest; `keep` receives a copy that must stay alive (with *req) until the
/// send completes or the job ends. Never blocks.
void isend_string(const std::string& s, int dest, int tag, MPI_Comm comm, std::string& keep, MPI_Request* req);

/// Receives a string sent with isend_string from source; false when nothing arrived by deadline.
bool recv_string_until(std::string& out, int source, int tag, MPI_Comm comm, double deadline,
                       PollPolicy policy = {});

}  // namespace hpct::comm
