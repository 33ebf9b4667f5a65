// hpct/parallel/started_collectives.hpp — the collectives an engine has started on device
// buffers and not yet joined: what runs after each, and the buffers each still uses.
//
// What it is: two queues over one comm::DeviceCollectives, each joined oldest first: gradient
// reductions and parameter all-gathers. A started collective is recorded with the backend's work
// on its result (`then`) and the working buffers it reads or writes (`hold`), which go back to the
// engine's pool only after the join. A join makes the backend's queue wait for the collective (no
// host wait). Where the transport does not queue, start() drains the backend's queue, runs the
// blocking call, and runs `then` at once. settle() joins everything and waits on the host, bounded.
// What it is not: the choice of what to start, or when (DeviceEngine's), nor the collectives
// themselves (comm/gpu.hpp).
#pragma once
#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "hpct/comm/gpu.hpp"
#include "hpct/kernels/ops_backend.hpp"

namespace hpct::parallel {

class StartedCollectives {
 public:
  using Held = std::vector<kernels::BackendBuffer>;
  using Ticket = comm::DeviceCollectives::Ticket;
  /// start's call of the transport: deadline, the backend's queue (nullptr where the transport does
  /// not queue), the ticket to set, and why it failed.
  using Start = std::function<bool(double deadline, void* queue, Ticket* t, std::string* why)>;
  enum class Kind { reduction, gather };

  /// give: returns a working buffer to the engine's pool. who: the rank in words, for errors.
  StartedCollectives(comm::DeviceCollectives& dc, kernels::OpsBackend& be, double timeout, size_t blocks,
                     std::function<void(kernels::BackendBuffer&&)> give, std::string who);
  /// An unwound step's collectives end before their buffers are freed (a failure aborted them).
  ~StartedCollectives();
  StartedCollectives(const StartedCollectives&) = delete;
  StartedCollectives& operator=(const StartedCollectives&) = delete;

  /// True where started collectives run behind the backend's queue (NCCL).
  bool queues() const { return dc_.queues(); }
  /// Starts a collective of `elems` elements (block: an all-gather's block, or -1), then joins the
  /// oldest of its kind while more than keep_elems elements of that kind are in flight. Throws
  /// hpct::Error naming `what` and the rank when the transport refuses it.
  void start(Kind k, size_t keep_elems, const char* what, size_t elems, int block, const Start& begin, Held hold,
             std::function<void()> then);
  /// Block b's all-gather joined (and the ones started before it); nothing where none is.
  void await(int block);
  bool gathering(int block) const { return gathering_[block] != 0; }
  /// Everything joined, and completed on the host (bounded by the timeout); throws naming the
  /// rank when a collective failed. Returns the seconds it waited.
  double settle();

 private:
  struct Pending {
    Ticket ticket = 0;
    size_t elems = 0;
    int block = -1;
    Held hold;
    std::function<void()> then;
  };
  struct Queue {
    std::deque<Pending> items;
    size_t elems = 0;
  };
  Queue& queue(Kind k) { return k == Kind::reduction ? reductions_ : gathers_; }
  void retire(Queue& q, size_t keep_elems);

  comm::DeviceCollectives& dc_;
  kernels::OpsBackend& be_;
  double timeout_;
  std::function<void(kernels::BackendBuffer&&)> give_;
  std::string who_;
  Queue reductions_, gathers_;
  std::vector<char> gathering_;  // a block whose all-gather is started, not yet joined
  bool unfinished_ = false;      // started since the last finish()
};

}  // namespace hpct::parallel
