// hpct/comm/mpi.hpp — MPI for host buffers: the environment, RAII communicators, typed collectives.
//
// Not here: NCCL (device buffers) lives beside this in nccl.hpp when built with CUDA. Every
// function marked "Collective over comm" must be called by every rank of that communicator in the
// same order; configs are validated identically on every rank so that all fail together.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hpct/core/error.hpp"

/// Checked MPI call: throws hpct::Error with the MPI error string, the call and file:line.
#define HPCT_CHECK_MPI(call)                                                  \
  do {                                                                        \
    int hpct_mpi_rc_ = (call);                                                \
    if (hpct_mpi_rc_ != MPI_SUCCESS) ::hpct::comm::throw_mpi_error(hpct_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)

namespace hpct::comm {

[[noreturn]] void throw_mpi_error(int rc, const char* call, const char* file, int line);

/// What the process promises MPI about threads. `funneled` (MPI_THREAD_FUNNELED): other threads
/// exist and only the main thread calls MPI (the trainer: background checkpoint writers, OpenMP).
/// `single` (MPI_THREAD_SINGLE): nothing but the main thread of the program runs (helper threads
/// of libraries that never call MPI aside, as with MPI_Init). Open MPI 4.1 takes a lock in every
/// call from funneled up, about 40-60 ns per small message here (bench/mpi_pingpong_modes.c):
/// latency probes ask for single.
enum class Threads { single, funneled };

/// RAII MPI_Init_thread / MPI_Finalize; labels hpct::Error messages with the world rank.
class Environment {
 public:
  Environment(int* argc, char*** argv, Threads threads = Threads::funneled);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
  /// Ends the whole job: used by an app's main only when other ranks would otherwise hang.
  [[noreturn]] static void abort(int code);
};

/// A nonblocking operation. wait() is idempotent; the destructor waits, so a request never dangles.
class Request {
 public:
  Request() = default;
  explicit Request(MPI_Request r) : r_(r) {}
  Request(Request&& o) noexcept : r_(o.r_) { o.r_ = MPI_REQUEST_NULL; }
  Request& operator=(Request&& o) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();
  void wait();
  /// Drives MPI progress; true when complete.
  bool test();

 private:
  MPI_Request r_ = MPI_REQUEST_NULL;
};

/// An owned (or borrowed, for MPI_COMM_WORLD) communicator.
class Communicator {
 public:
  static Communicator world();
  /// This rank alone (MPI_COMM_SELF): a one-rank job inside a larger one, e.g. for reference runs.
  static Communicator self();
  Communicator() = default;
  Communicator(Communicator&& o) noexcept;
  Communicator& operator=(Communicator&& o) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm raw() const { return comm_; }

  /// Collective over this comm: MPI_Comm_split.
  Communicator split(int color, int key) const;
  /// Collective over this comm: this rank's index among the ranks that share its node (its shared-
  /// memory domain, MPI_COMM_TYPE_SHARED), for picking a node-local GPU or disk.
  int node_local_rank() const;
  /// Collective over this comm: how many of its ranks share this rank's node.
  int node_local_size() const;
  /// Collective over this comm.
  void barrier() const;
  /// Collective over this comm: in-place sum of n values.
  void allreduce_sum(float* data, size_t n) const;
  void allreduce_sum(double* data, size_t n) const;
  /// Collective over this comm, nonblocking: in-place sum; n must be < 2^31.
  Request iallreduce_sum(float* data, size_t n) const;
  double allreduce_max(double v) const;
  /// Collective over this comm: in-place element-wise maximum of n values.
  void allreduce_max(float* data, size_t n) const;
  double allreduce_min(double v) const;
  /// Collective over this comm: sum reduced into root's buffer only (other ranks' data untouched).
  void reduce_sum(double* data, size_t n, int root) const;
  /// Collective over this comm: broadcast n bytes from root.
  void bcast_bytes(void* data, size_t n, int root) const;
  void bcast_string(std::string& s, int root) const;
  /// Collective over this comm: rank r sends send[i*n .. (i+1)*n) to rank i and receives rank i's
  /// block r into recv[i*n ..) (MPI_Alltoall of ints, n per pair).
  void alltoall(const int* send, int* recv, int n) const;
  /// Collective over this comm: rows of `width` floats; send_rows[i] rows go to rank i (packed in
  /// rank order in send), recv_rows[i] come from rank i (packed in rank order into recv). Counts
  /// must agree pairwise (exchange them with alltoall first). Element counts must fit an int.
  void alltoallv_rows(const float* send, const std::vector<int>& send_rows, float* recv,
                      const std::vector<int>& recv_rows, int width) const;
  /// Collective over this comm: data holds size() blocks of n floats; rank r gives block r (in
  /// place) and every rank ends with all of them (MPI_Allgather). size() * n must fit an int.
  void allgather_blocks(float* data, size_t n) const;
  /// Collective over this comm: data holds every rank's rows of `width` floats packed in rank
  /// order, rows[r] of them from rank r; rank r gives its own (in place) and every rank ends with
  /// all of them (MPI_Allgatherv). rows must be the same on every rank; the total must fit an int.
  void allgatherv_rows(float* data, const std::vector<int>& rows, int width) const;
  /// Collective over this comm: send holds rows for every rank packed in rank order (rows[r] rows
  /// of `width` floats for rank r); rank r receives into recv the element-wise sum of every rank's
  /// rows for it (MPI_Reduce_scatter). rows must be the same on every rank; the total must fit an int.
  void reduce_scatterv_rows(const float* send, float* recv, const std::vector<int>& rows, int width) const;
  /// Collective over this comm: send holds size() blocks of n floats; rank r receives into recv the
  /// element-wise sum of every rank's block r (MPI_Reduce_scatter_block). size() * n must fit an int.
  void reduce_scatter_blocks(const float* send, float* recv, size_t n) const;
  /// Collective over this comm: gathers one double from every rank on every rank.
  std::vector<double> allgather(double v) const;
  /// Collective over this comm: every rank gives v of the same length n; returns size() * n values,
  /// rank r's at [r * n, (r + 1) * n).
  std::vector<double> allgather(const std::vector<double>& v) const;
  /// Collective over this comm: gathers one string (any length) from every rank on every rank.
  std::vector<std::string> allgather_string(const std::string& s) const;

 private:
  Communicator(MPI_Comm c, bool owned);
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = 0;
  int size_ = 1;
};

/// Collective over comm: true on every rank iff `ok` is true on every rank. Lets one rank's
/// validation failure stop all ranks together instead of leaving the others in a collective.
bool all_ok(const Communicator& comm, bool ok);

/// Collective over comm: every rank passes its error text ("" if none). If any rank has one,
/// every rank throws the first failing rank's, labelled "[rank r]", as Error::relayed — so a
/// failure on one rank stops all of them at the same point instead of leaving peers in a collective.
void throw_if_any(const Communicator& comm, const std::string& error);

/// Runs f; returns the text of the std::exception it throws, "" if none. With throw_if_any it
/// turns one rank's failure into everyone's.
template <class F>
std::string error_text_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace hpct::comm
