// hpct/comm/ucx.hpp — a small UCP (UCX) tag-matching endpoint set, and the network resources UCX
// sees, for probes that want the fabric without MPI's protocol choices in between.
//
// Not a communicator: there are no collectives, and peers find each other through worker addresses
// the caller exchanges (over MPI, typically). Every wait takes a deadline, as in deadline.hpp, so a
// hung peer is reported rather than waited on; after a timeout the operations stay pending and the
// caller ends the job. UCX headers stay out of this header: a build without UCX (libucx-dev absent)
// still compiles, and ucx_available() says false.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hpct::comm {

/// True when hpctrain was built with UCX.
bool ucx_available();
/// The UCX library version ("1.13.1"), or "" without UCX.
std::string ucx_version();

/// One transport resource as UCT lists it: e.g. {"ib", "mlx5_0", "rc_mlx5", "mlx5_0:1", "net"}.
struct UcxDevice {
  std::string component;  // UCT component: ib, tcp, posix, sysv, self, cma, ...
  std::string md;         // memory domain
  std::string transport;  // tl name
  std::string device;     // device name ("mlx5_0:1" for an IB port)
  std::string type;       // net, shm, acc, self
};
/// Every transport resource of every component. Throws hpct::Error without UCX.
std::vector<UcxDevice> ucx_devices();

/// A UCP context + one worker (single-threaded) + endpoints to peers.
class UcxWorker {
 public:
  /// Throws hpct::Error (with the UCX status text) when UCX cannot start, or without UCX.
  UcxWorker();
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  /// This worker's address, to hand to peers.
  std::vector<char> address() const;
  /// Creates an endpoint to a peer's worker address; returns its index for post_send.
  int connect(const std::vector<char>& peer_address);

  /// Starts a tagged send / receive (full-mask tag match); completion is awaited by wait_all_until.
  /// Buffers must stay alive until then (or until the job ends, after a timeout).
  void post_send(int ep, const void* buf, size_t n, uint64_t tag);
  void post_recv(void* buf, size_t n, uint64_t tag);
  /// Progresses until every posted operation completes (true) or deadline (steady_seconds) passes.
  /// A failed operation (e.g. truncation, endpoint error) throws hpct::Error.
  bool wait_all_until(double deadline, bool yield = false);

  /// Closes every endpoint (flush), giving up at deadline. Call only when every peer is healthy.
  void close_endpoints(double deadline);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hpct::comm
