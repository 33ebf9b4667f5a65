// Pairings, transports (MPI, UCX) and the control channel of the fabric checks.
#include "fabric.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "hpct/comm/mpi.hpp"
#include "hpct/comm/ucx.hpp"
#include "hpct/core/error.hpp"

namespace hpct::healthcheck {

namespace {
// Strings and requests handed to MPI that must outlive any wait that gave up: kept to the end.
std::deque<std::string>& kept_strings() {
  static std::deque<std::string> d;
  return d;
}
}  // namespace

const Fault* FabricContext::fault(const std::string& check) const {
  for (const auto& f : faults)
    if (f.rank == rank && f.check == check) return &f;
  return nullptr;
}

void FabricContext::maybe_stop(const std::string& check) const {
  const Fault* f = fault(check);
  if (!f || (f->kind != Fault::Kind::hang && f->kind != Fault::Kind::die)) return;
  std::fprintf(stderr, "ib_healthcheck: fault injection: rank %d (%s) %s in %s\n", rank, nodes[rank].c_str(),
               f->kind == Fault::Kind::hang ? "stops responding" : "exits", check.c_str());
  std::fflush(stderr);
  if (f->kind == Fault::Kind::die) _exit(3);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // until MPI_Abort ends the job
}

std::vector<std::vector<int>> pairings(int n, int rounds) {
  // Circle method on m = n (even) or n + 1 (odd, the extra seat is "sit out") seats: seat m-1 is
  // fixed, the others rotate; in round r, seat m-1 meets r and (r+i) meets (r-i) mod (m-1).
  int m = n % 2 == 0 ? n : n + 1;
  int max_rounds = std::max(1, m - 1);
  rounds = std::min(rounds, max_rounds);
  std::vector<std::vector<int>> out;
  if (n < 2) return out;
  for (int r = 0; r < rounds; ++r) {
    std::vector<int> partner(static_cast<size_t>(n), -1);
    auto pair = [&](int a, int b) {
      if (a < n && b < n) {
        partner[static_cast<size_t>(a)] = b;
        partner[static_cast<size_t>(b)] = a;
      }
    };
    pair(m - 1, r);
    for (int i = 1; i < m / 2; ++i) pair((r + i) % (m - 1), (r - i + (m - 1)) % (m - 1));
    out.push_back(std::move(partner));
  }
  return out;
}

void fill_pattern(unsigned char* buf, size_t n, int rank, int step) {
  for (size_t i = 0; i < n; ++i) buf[i] = pattern_byte(rank, step, i);
}

size_t count_wrong(const unsigned char* buf, size_t n, int rank, int step) {
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += buf[i] != pattern_byte(rank, step, i);
  return wrong;
}

void slow_down(const Fault* f, double seconds) {
  if (!f || f->kind != Fault::Kind::slow || !(seconds > 0)) return;
  std::this_thread::sleep_for(std::chrono::duration<double>((f->factor - 1) * seconds));
}

// --- MPI transport --------------------------------------------------------------------------

namespace {
class MpiTransport : public PairTransport {
 public:
  explicit MpiTransport(const FabricContext& ctx) : comm_(ctx.data), poll_(ctx.poll) {}
  std::string name() const override { return "mpi"; }
  void send(int peer, const void* buf, size_t n, int tag) override {
    MPI_Request r;
    HPCT_CHECK_MPI(MPI_Isend(buf, static_cast<int>(n), MPI_BYTE, peer, tag, comm_, &r));
    reqs_.push_back(r);
  }
  void recv(int peer, void* buf, size_t n, int tag) override {
    MPI_Request r;
    HPCT_CHECK_MPI(MPI_Irecv(buf, static_cast<int>(n), MPI_BYTE, peer, tag, comm_, &r));
    reqs_.push_back(r);
  }
  bool wait(double deadline) override {
    bool ok = comm::wait_all_until(reqs_.data(), static_cast<int>(reqs_.size()), deadline, poll_);
    reqs_.clear();  // on a timeout the requests stay pending inside MPI; we never touch them again
    return ok;
  }
  bool offers_blocking() const override { return true; }
  void send_blocking(int peer, const void* buf, size_t n, int tag) override {
    HPCT_CHECK_MPI(MPI_Send(buf, static_cast<int>(n), MPI_BYTE, peer, tag, comm_));
  }
  void recv_blocking(int peer, void* buf, size_t n, int tag) override {
    HPCT_CHECK_MPI(MPI_Recv(buf, static_cast<int>(n), MPI_BYTE, peer, tag, comm_, MPI_STATUS_IGNORE));
  }

 private:
  MPI_Comm comm_;
  comm::PollPolicy poll_;
  std::vector<MPI_Request> reqs_;
};

class UcxTransport : public PairTransport {
 public:
  UcxTransport(std::unique_ptr<comm::UcxWorker> w, std::vector<std::vector<char>> addrs, int rank, bool yield)
      : worker_(std::move(w)), addrs_(std::move(addrs)), ep_(addrs_.size(), -1), rank_(rank), yield_(yield) {}
  std::string name() const override { return "ucx"; }
  void send(int peer, const void* buf, size_t n, int tag) override {
    auto& ep = ep_.at(static_cast<size_t>(peer));
    if (ep < 0) ep = worker_->connect(addrs_[static_cast<size_t>(peer)]);
    worker_->post_send(ep, buf, n, make_tag(rank_, peer, tag));
  }
  void recv(int peer, void* buf, size_t n, int tag) override { worker_->post_recv(buf, n, make_tag(peer, rank_, tag)); }
  bool wait(double deadline) override {
    ok_ = worker_->wait_all_until(deadline, yield_) && ok_;
    return ok_;
  }
  ~UcxTransport() override {
    // Endpoints are closed only when every operation completed; otherwise the process exit (after
    // MPI_Abort) takes them.
    if (ok_) worker_->close_endpoints(comm::steady_seconds() + 5);
  }

 private:
  static uint64_t make_tag(int src, int dst, int tag) {
    return (static_cast<uint64_t>(src) << 40) | (static_cast<uint64_t>(dst) << 16) | static_cast<uint64_t>(tag & 0xffff);
  }
  std::unique_ptr<comm::UcxWorker> worker_;
  std::vector<std::vector<char>> addrs_;
  std::vector<int> ep_;
  int rank_;
  bool yield_;
  bool ok_ = true;
};
}  // namespace

std::unique_ptr<PairTransport> make_mpi_transport(const FabricContext& ctx) { return std::make_unique<MpiTransport>(ctx); }

std::unique_ptr<PairTransport> make_ucx_transport(const FabricContext& ctx, std::string& why) {
  // Every rank joins the exchange even when its own UCX failed (length 0), so nobody waits on it.
  std::unique_ptr<comm::UcxWorker> worker;
  std::vector<char> mine;
  std::string local_error;
  try {
    worker = std::make_unique<comm::UcxWorker>();
    mine = worker->address();
  } catch (const std::exception& e) {
    local_error = e.what();
  }
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(ctx.size));
  MPI_Request r;
  HPCT_CHECK_MPI(MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, ctx.data, &r));
  if (!comm::wait_all_until(&r, 1, ctx.deadline(), ctx.poll)) {
    why = "UCX address exchange timed out";
    return nullptr;
  }
  std::vector<int> displs(static_cast<size_t>(ctx.size), 0);
  for (int i = 1; i < ctx.size; ++i) displs[static_cast<size_t>(i)] = displs[static_cast<size_t>(i) - 1] + lens[static_cast<size_t>(i) - 1];
  auto* all = new std::vector<char>(static_cast<size_t>(displs.back() + lens.back()));  // kept on a timeout
  HPCT_CHECK_MPI(MPI_Iallgatherv(mine.data(), len, MPI_CHAR, all->data(), lens.data(), displs.data(), MPI_CHAR, ctx.data, &r));
  if (!comm::wait_all_until(&r, 1, ctx.deadline(), ctx.poll)) {
    why = "UCX address exchange timed out";
    return nullptr;
  }
  std::vector<std::vector<char>> addrs(static_cast<size_t>(ctx.size));
  std::string missing;
  for (int i = 0; i < ctx.size; ++i) {
    auto b = all->begin() + displs[static_cast<size_t>(i)];
    addrs[static_cast<size_t>(i)].assign(b, b + lens[static_cast<size_t>(i)]);
    if (lens[static_cast<size_t>(i)] == 0) missing += (missing.empty() ? "" : ",") + ctx.nodes[static_cast<size_t>(i)];
  }
  delete all;
  if (!local_error.empty()) throw Error("UCX on " + ctx.nodes[static_cast<size_t>(ctx.rank)] + ": " + local_error);
  if (!missing.empty()) {
    why = "UCX failed to start on " + missing;
    return nullptr;
  }
  return std::make_unique<UcxTransport>(std::move(worker), std::move(addrs), ctx.rank, ctx.poll.yield);
}

// --- control channel -------------------------------------------------------------------------

PhaseSync sync_phase(FabricContext& ctx, int phase, const nlohmann::json& mine, double wait_s) {
  PhaseSync out;
  const int report_tag = 100 + phase, decision_tag = 200 + phase;
  if (ctx.rank == 0) {
    out.reports.resize(static_cast<size_t>(ctx.size));
    out.reports[0] = mine;
    bool timed_out = mine.value("timed_out", false);
    double deadline = comm::steady_seconds() + wait_s;
    for (int r = 1; r < ctx.size; ++r) {
      std::string s;
      if (comm::recv_string_until(s, r, report_tag, ctx.ctl, deadline, ctx.poll)) {
        out.reports[static_cast<size_t>(r)] = nlohmann::json::parse(s);
        timed_out = timed_out || out.reports[static_cast<size_t>(r)]->value("timed_out", false);
      } else {
        out.silent.push_back(r);
      }
    }
    out.go = out.silent.empty() && !timed_out;
    std::string decision = nlohmann::json{{"go", out.go}}.dump();
    for (int r = 1; r < ctx.size; ++r) {
      if (std::find(out.silent.begin(), out.silent.end(), r) != out.silent.end()) continue;
      kept_strings().emplace_back();
      MPI_Request req;
      comm::isend_string(decision, r, decision_tag, ctx.ctl, kept_strings().back(), &req);
      MPI_Request_free(&req);  // small, eager; completion is not needed
    }
    return out;
  }
  kept_strings().emplace_back();
  MPI_Request req;
  comm::isend_string(mine.dump(), 0, report_tag, ctx.ctl, kept_strings().back(), &req);
  MPI_Request_free(&req);
  // Rank 0 may itself have spent a timeout in its own probes before it starts waiting for us.
  double bound = wait_s + 3 * ctx.timeout_s + 10;
  std::string s;
  if (!comm::recv_string_until(s, 0, decision_tag, ctx.ctl, comm::steady_seconds() + bound, ctx.poll))
    throw SilentPeer("rank 0 (" + ctx.nodes[0] + ") did not answer within " + std::to_string(static_cast<int>(bound)) +
                " s: it is hung or dead, so no report can be written; treat " + ctx.nodes[0] + " as unhealthy");
  out.go = nlohmann::json::parse(s).value("go", false);
  return out;
}

bool fresh_data_comm(FabricContext& ctx) {
  MPI_Comm c;
  MPI_Request r;
  HPCT_CHECK_MPI(MPI_Comm_idup(ctx.world, &c, &r));
  if (!comm::wait_all_until(&r, 1, ctx.deadline(), ctx.poll)) return false;
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  // The previous data communicator is not freed: after a timeout it may still hold pending work.
  ctx.data = c;
  return true;
}

}  // namespace hpct::healthcheck
