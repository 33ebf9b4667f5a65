// The collectives an engine has started and not yet joined (see started_collectives.hpp).
#include "hpct/parallel/started_collectives.hpp"

#include "hpct/comm/deadline.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/timer.hpp"

namespace hpct::parallel {

StartedCollectives::StartedCollectives(comm::DeviceCollectives& dc, kernels::OpsBackend& be, double timeout,
                                       size_t blocks, std::function<void(kernels::BackendBuffer&&)> give,
                                       std::string who)
    : dc_(dc), be_(be), timeout_(timeout), give_(std::move(give)), who_(std::move(who)), gathering_(blocks, 0) {}

StartedCollectives::~StartedCollectives() {
  if (!unfinished_) return;
  std::string why;
  dc_.finish(comm::steady_seconds() + timeout_, &why);  // a failure has aborted the communicator
}

// Where the transport queues (NCCL) the collective runs while the backend goes on; `then` and the
// return of `hold` to the pool wait until it is joined: when more than keep_elems elements of its
// kind are in flight, when its result is needed (await), and at settle(). Elsewhere it is done
// when start returns, and so is `then`.
void StartedCollectives::start(Kind k, size_t keep_elems, const char* what, size_t elems, int block,
                               const Start& begin, Held hold, std::function<void()> then) {
  const bool queued = dc_.queues();
  if (!queued) be_.synchronize();  // what the backend's queue wrote is in the buffer before the collective reads it
  std::string why;
  Ticket t = 0;
  unfinished_ = true;
  if (!begin(comm::steady_seconds() + timeout_, queued ? be_.queue_handle() : nullptr, &t, &why))
    throw Error(std::string("GPU-resident ZeRO: the data-parallel ") + what + " on device buffers failed on " + who_ +
                ": " + why);
  if (!queued) {
    if (then) then();
    for (auto& h : hold) give_(std::move(h));
    return;
  }
  Queue& q = queue(k);
  q.items.push_back(Pending{t, elems, block, std::move(hold), std::move(then)});
  q.elems += elems;
  if (block >= 0) gathering_[block] = 1;
  retire(q, keep_elems);
}

void StartedCollectives::retire(Queue& q, size_t keep_elems) {
  while (!q.items.empty() && q.elems > keep_elems) {
    Pending p = std::move(q.items.front());
    q.items.pop_front();
    q.elems -= p.elems;
    dc_.join(p.ticket, be_.queue_handle());  // the backend's later work (then, the buffers' next users) after it
    if (p.then) p.then();
    for (auto& h : p.hold) give_(std::move(h));
    if (p.block >= 0) gathering_[p.block] = 0;
  }
}

void StartedCollectives::await(int block) {
  while (gathering_[block]) {  // the all-gathers before it joined too (one queue, in order)
    const size_t keep = gathers_.elems - gathers_.items.front().elems;
    retire(gathers_, keep);
  }
}

double StartedCollectives::settle() {
  if (!unfinished_) return 0;
  Timer timer;
  retire(reductions_, 0);
  retire(gathers_, 0);
  unfinished_ = false;
  std::string why;
  if (!dc_.finish(comm::steady_seconds() + timeout_, &why))
    throw Error("GPU-resident ZeRO: the data-parallel collectives on device buffers failed on " + who_ + ": " + why);
  return timer.seconds();
}

}  // namespace hpct::parallel
