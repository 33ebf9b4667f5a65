// hpct/comm/deadline.hpp — MPI waits that give up at a deadline instead of hanging.
//
// A health check must name a dead or hung peer, not join it: every wait here polls with MPI_Test*
// until the operations complete or a steady-clock deadline passes. What it is not: a fault-tolerant
// MPI. On a timeout the operations stay pending (MPI can cancel neither a send nor a collective),
// so the caller keeps the buffers alive, stops using the communicator for data, and ends the job
// with MPI_Abort once it has reported (Open MPI 4.1 cannot finalize beside a hung rank).
#pragma once
#include <mpi.h>

#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace hpct::comm {

/// Seconds on the steady clock (the time base of every deadline here).
double steady_seconds();

/// How a poll loop behaves while it waits: spin (lowest latency, one core per rank) or give the
/// core away between polls (sched_yield) when more ranks than cores share a host.
struct PollPolicy {
  bool yield = false;
};

/// Keeps a buffer handed to MPI (or UCX) by an operation whose wait gave up alive until the process
/// exits: the operation is still pending and may write into it (nothing can be cancelled).
template <typename T>
void keep_until_exit(std::vector<T>&& buf) {
  static std::deque<std::vector<T>> kept;
  kept.push_back(std::move(buf));
}

/// Polls until all n requests complete (true) or deadline passes (false, requests left pending).
bool wait_all_until(MPI_Request* reqs, int n, double deadline, PollPolicy policy = {});

/// Starts sending s to dest; `keep` receives a copy that must stay alive (with *req) until the
/// send completes or the job ends. Never blocks.
void isend_string(const std::string& s, int dest, int tag, MPI_Comm comm, std::string& keep, MPI_Request* req);

/// Guards a loop of blocking calls that cannot be abandoned (ib_healthcheck's timed MPI latency
/// batches: blocking MPI_Send/MPI_Recv cost 20-50 ns less per message than any pollable form in
/// Open MPI 4.1 on shared memory, and the reference tools use them). While armed, a one-shot
/// SIGALRM timer runs; if it fires, the handler writes `message` to stderr and ends the process
/// with _exit(exit_code), both async-signal-safe (nothing else, MPI least of all, may run in a
/// handler); the launcher then ends the job. No report is written that way, so guard only short
/// windows that both sides entered alive. One guard per process at a time.
class AlarmGuard {
 public:
  AlarmGuard(const std::string& message, int exit_code);
  ~AlarmGuard();  // disarms and restores the previous SIGALRM action
  AlarmGuard(const AlarmGuard&) = delete;
  AlarmGuard& operator=(const AlarmGuard&) = delete;
  /// (Re)starts the timer: it fires `seconds` from now unless re-armed or disarmed first.
  void arm(double seconds);
  void disarm();
};

/// Receives a string sent with isend_string from source; false when nothing arrived by deadline.
bool recv_string_until(std::string& out, int source, int tag, MPI_Comm comm, double deadline,
                       PollPolicy policy = {});

}  // namespace hpct::comm
