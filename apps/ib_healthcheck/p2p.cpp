// Point-to-point probes, written once over PairTransport (MPI or UCX).
//
// Per pair (a < b), in order: a verified exchange at bw_size, latency (a times ping-pongs),
// bandwidth a->b (a times) and b->a (b times), bidirectional (a times). Pairs of one round run
// concurrently, as on a real allocation where every node has its own NIC; ranks sharing cores
// (tests) see noisier figures, which is why test thresholds are relative and generous.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <thread>

#include "checks.hpp"
#include "hpct/comm/deadline.hpp"

namespace hpct::healthcheck {
namespace {

enum Tag { kVerify = 1, kLat = 2, kBw = 3, kAck = 4, kBibw = 5, kLatReady = 6 };

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

struct Timeout {};  // thrown inside one pair's probe when a wait gives up

class PairProbe {
 public:
  PairProbe(FabricContext& ctx, PairTransport& t, const std::string& check, const P2pConfig& cfg, int peer,
            std::vector<unsigned char>& sbuf, std::vector<unsigned char>& rbuf, nlohmann::json& rows)
      : ctx_(ctx), t_(t), check_(check), cfg_(cfg), peer_(peer), sbuf_(sbuf), rbuf_(rbuf), rows_(rows),
        fault_(ctx.fault(check)), initiator_(ctx.rank < peer) {}

  void run() {
    verify();
    latency();
    bandwidth(initiator_ ? ctx_.rank : peer_);  // a -> b first, then b -> a
    bandwidth(initiator_ ? peer_ : ctx_.rank);
    bidirectional();
  }

  /// After a timeout: rows this rank owns and has not produced yet, with the error.
  void fail_remaining(const std::string& error) {
    for (const auto& [metric, subject] : owned()) {
      bool have = false;
      for (const auto& r : rows_) have = have || (r["metric"] == metric && r["subject"] == subject);
      if (!have) add(metric, subject, NAN, metric == "data" ? "" : unit(metric), 0, error);
    }
  }

 private:
  const std::string& me() const { return ctx_.nodes[static_cast<size_t>(ctx_.rank)]; }
  const std::string& peer() const { return ctx_.nodes[static_cast<size_t>(peer_)]; }
  std::string both() const { return initiator_ ? me() + "<->" + peer() : peer() + "<->" + me(); }
  static std::string unit(const std::string& metric) { return metric == "latency" ? "us" : metric == "data" ? "bytes" : "GB/s"; }

  std::vector<std::pair<std::string, std::string>> owned() const {
    std::vector<std::pair<std::string, std::string>> o = {{"data", peer() + "->" + me()}, {"bandwidth", me() + "->" + peer()}};
    if (initiator_) {
      o.push_back({"latency", both()});
      o.push_back({"bidir_bandwidth", both()});
    }
    return o;
  }

  void add(const std::string& metric, const std::string& subject, double value, const std::string& unit_, uint64_t size,
           const std::string& error = "") {
    nlohmann::json r = {{"check", check_}, {"metric", metric}, {"subject", subject},
                        {"ranks", {std::min(ctx_.rank, peer_), std::max(ctx_.rank, peer_)}},
                        {"size", size}, {"unit", unit_}, {"error", error}};
    r["value"] = std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
    rows_.push_back(std::move(r));
  }

  // The deadline is re-armed per window and every 64 ping-pongs rather than per operation: reading
  // the clock costs ~20 ns, a shared-memory ping-pong ~300 ns.
  void arm() { deadline_ = ctx_.deadline(); }
  void wait() {
    if (!t_.wait(deadline_)) throw Timeout{};
  }

  void verify() {
    const size_t n = cfg_.bw_size;
    arm();
    fill_pattern(sbuf_.data(), n, ctx_.rank, kVerify);
    if (fault_ && fault_->kind == Fault::Kind::lossy)
      for (size_t i = 0; i < n; i += 4096) sbuf_[i] ^= 0x5a;  // one byte in every 4 KiB arrives wrong
    std::fill(rbuf_.begin(), rbuf_.begin() + static_cast<std::ptrdiff_t>(n), 0);
    t_.recv(peer_, rbuf_.data(), n, kVerify);
    t_.send(peer_, sbuf_.data(), n, kVerify);
    wait();
    add("data", peer() + "->" + me(), static_cast<double>(count_wrong(rbuf_.data(), n, peer_, kVerify)), "bytes", n);
  }

  // Each probe: warm-up iterations (also the slow fault's reference time), then timed ones.
  // Latency is timed in batches of kBatch ping-pongs (one clock read per batch, as a clock read
  // costs ~20 ns against a ~300 ns shared-memory round trip); the figure is the median over
  // batches of half the mean round trip, so a burst of noise moves it only when it spans most
  // batches.
  //
  // Over MPI the batches use blocking MPI_Send/MPI_Recv, as NetPIPE and OSU do: every pollable
  // receive of Open MPI 4.1 costs 20-50 ns more per message on shared memory (docs/benchmarks/fabric.md),
  // and ib_healthcheck's MPI latency read 1.3-1.7x NetPIPE's. A blocking call cannot give up on a
  // dead peer, so each batch runs under an alarm (comm::AlarmGuard) set to the timeout: if the
  // peer stops inside a batch, this rank prints who and ends the job; rank 0 writes no report
  // then. A pollable round trip just before the batches catches a peer that stopped (or gave up
  // on this pair) earlier; what remains is a peer stopping within these few milliseconds.
  void latency() {
    constexpr int kBatch = 50;
    const size_t n = cfg_.lat_size;
    const int iters = (cfg_.lat_iters + kBatch - 1) / kBatch * kBatch;
    const int warm = std::max(kBatch, iters / 10 / kBatch * kBatch);
    // Not with more ranks than cores on the host (tests): a blocking receive spins without ever
    // yielding, so two pairs sharing two cores take milliseconds per round trip and a batch can
    // outlast the alarm (seen under srun, where Open MPI does not know to yield).
    const bool blocking = t_.offers_blocking() && !ctx_.poll.yield;
    std::optional<comm::AlarmGuard> alarm;
    if (blocking) {
      // One pollable round trip on a tag only this step uses, before any blocking call: a partner
      // that already gave up on this pair (its earlier wait timed out while this rank was slow) may
      // have left receives pending that matched the verified exchange, but it never posts this
      // one, so the wait times out and the pair is reported as usual.
      arm();
      t_.recv(peer_, rbuf_.data(), n, kLatReady);
      t_.send(peer_, sbuf_.data(), n, kLatReady);
      wait();
      alarm.emplace("ib_healthcheck: rank " + std::to_string(ctx_.rank) + " (" + me() + "): " + check_ +
                        " latency: no reply from rank " + std::to_string(peer_) + " (" + peer() + ") within " +
                        std::to_string(static_cast<int>(ctx_.timeout_s)) +
                        " s inside a batch of blocking ping-pongs, which cannot be abandoned: ending the job "
                        "without a report; " + peer() + " or the link to it stopped responding",
                    kExitUnhealthy);
    }
    std::vector<double> rtt, warm_rtt;  // per batch: mean round trip
    double ref = 0, t_batch = 0;
    for (int i = 0; i <= warm + iters; ++i) {
      if (i % kBatch == 0) {
        if (i > 0) (i <= warm ? warm_rtt : rtt).push_back((comm::steady_seconds() - t_batch) / kBatch);
        if (i == warm) ref = median(warm_rtt);
        if (i == warm + iters) break;
        arm();
        if (alarm) alarm->arm(ctx_.timeout_s);
        if (i == warm && fault_ && fault_->kind == Fault::Kind::freeze) freeze(alarm);
        t_batch = comm::steady_seconds();
      }
      if (i >= warm) slow_down(fault_, ref);
      if (blocking) {
        if (initiator_) {
          t_.send_blocking(peer_, sbuf_.data(), n, kLat);
          t_.recv_blocking(peer_, rbuf_.data(), n, kLat);
        } else {
          t_.recv_blocking(peer_, rbuf_.data(), n, kLat);
          t_.send_blocking(peer_, sbuf_.data(), n, kLat);
        }
      } else if (initiator_) {
        // Send first, then post the receive while the ping is in flight (ucx_perftest's order):
        // posting it first delays the ping by the ~20-30 ns the post takes.
        t_.send(peer_, sbuf_.data(), n, kLat);
        t_.recv(peer_, rbuf_.data(), n, kLat);
        wait();
      } else {
        t_.recv(peer_, rbuf_.data(), n, kLat);
        wait();
        t_.send(peer_, sbuf_.data(), n, kLat);
        wait();
      }
    }
    if (initiator_) add("latency", both(), median(rtt) / 2 * 1e6, "us", n);
  }

  // The freeze fault: stop at the start of the timed batches, as a node dying there would (its own alarm
  // disarmed: a dead node runs no handler), so the partner's alarm is what ends the job.
  // Polling (more ranks than cores), the partner's wait times out and rank 0 reports it instead.
  void freeze(std::optional<comm::AlarmGuard>& alarm) {
    if (alarm) alarm->disarm();
    std::fprintf(stderr, "ib_healthcheck: fault injection: rank %d (%s) freezes in %s latency\n", ctx_.rank,
                 me().c_str(), check_.c_str());
    std::fflush(stderr);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // until the job is ended
  }

  // Bandwidth probes time every window and take the median window: one descheduled window (ranks
  // sharing cores, a daemon waking up) must not fail a healthy link, while a slow node is slow in
  // every window. OSU divides by the total time instead; on a quiet machine the two agree.
  void bandwidth(int sender) {
    const size_t n = cfg_.bw_size;
    const int warm = 2, w = cfg_.window;
    const bool sending = sender == ctx_.rank;
    std::vector<double> warm_t, window_t;
    double ref = 0;
    for (int i = 0; i < warm + cfg_.bw_iters; ++i) {
      if (i == warm) ref = median(warm_t);
      if (i >= warm) slow_down(fault_, ref);
      double t0 = comm::steady_seconds();
      arm();
      if (sending) {
        t_.recv(peer_, rbuf_.data(), 4, kAck);
        for (int k = 0; k < w; ++k) t_.send(peer_, sbuf_.data(), n, kBw);
        wait();
      } else {
        // Every message of a window lands in the same buffer (OSU does the same): the data were
        // verified above; here only the time counts.
        for (int k = 0; k < w; ++k) t_.recv(peer_, rbuf_.data(), n, kBw);
        wait();
        t_.send(peer_, sbuf_.data(), 4, kAck);
        wait();
      }
      (i < warm ? warm_t : window_t).push_back(comm::steady_seconds() - t0);
    }
    if (sending) add("bandwidth", me() + "->" + peer(), static_cast<double>(n) * w / median(window_t) / 1e9, "GB/s", n);
  }

  void bidirectional() {
    const size_t n = cfg_.bw_size;
    const int warm = 2, w = cfg_.window;
    std::vector<double> warm_t, window_t;
    double ref = 0;
    for (int i = 0; i < warm + cfg_.bw_iters; ++i) {
      if (i == warm) ref = median(warm_t);
      if (i >= warm) slow_down(fault_, ref);
      double t0 = comm::steady_seconds();
      arm();
      for (int k = 0; k < w; ++k) t_.recv(peer_, rbuf_.data(), n, kBibw);
      for (int k = 0; k < w; ++k) t_.send(peer_, sbuf_.data(), n, kBibw);
      wait();
      (i < warm ? warm_t : window_t).push_back(comm::steady_seconds() - t0);
    }
    if (initiator_) add("bidir_bandwidth", both(), 2.0 * static_cast<double>(n) * w / median(window_t) / 1e9, "GB/s", n);
  }

  FabricContext& ctx_;
  PairTransport& t_;
  const std::string& check_;
  const P2pConfig& cfg_;
  int peer_;
  std::vector<unsigned char>& sbuf_;
  std::vector<unsigned char>& rbuf_;
  nlohmann::json& rows_;
  const Fault* fault_;
  bool initiator_;
  double deadline_ = 0;
};

}  // namespace

nlohmann::json run_p2p(FabricContext& ctx, PairTransport& t, const std::string& check, const P2pConfig& cfg,
                       const std::vector<std::vector<int>>& rounds, Progress* progress, bool& timed_out) {
  nlohmann::json rows = nlohmann::json::array();
  size_t n = std::max<size_t>(std::max(cfg.bw_size, cfg.lat_size), 4);
  std::vector<unsigned char> sbuf(n), rbuf(n);
  const int nrounds = static_cast<int>(rounds.size());
  const int stop_round = std::min(1, nrounds - 1);  // where a hang/die fault strikes: mid-check
  for (int r = 0; r < nrounds; ++r) {
    if (r == stop_round) ctx.maybe_stop(check);
    int peer = rounds[static_cast<size_t>(r)][static_cast<size_t>(ctx.rank)];
    if (peer >= 0 && !timed_out) {
      nlohmann::json pair_rows = nlohmann::json::array();
      PairProbe probe(ctx, t, check, cfg, peer, sbuf, rbuf, pair_rows);
      try {
        probe.run();
      } catch (const Timeout&) {
        timed_out = true;
        probe.fail_remaining("timeout: no progress with " + ctx.nodes[static_cast<size_t>(peer)] + " within " +
                             std::to_string(static_cast<int>(ctx.timeout_s)) + " s");
        // The transport may still write into these buffers: keep them, take fresh ones.
        comm::keep_until_exit(std::move(sbuf));
        comm::keep_until_exit(std::move(rbuf));
        sbuf.assign(n, 0);
        rbuf.assign(n, 0);
      }
      for (auto& x : pair_rows) rows.push_back(std::move(x));
    }
    if (progress) progress->done(check + " round " + std::to_string(r + 1) + "/" + std::to_string(nrounds), p2p_round_weight(cfg));
  }
  return rows;
}

double p2p_round_weight(const P2pConfig& cfg) {
  return 4.0 * cfg.window * cfg.bw_iters * static_cast<double>(cfg.bw_size) + 2.0 * cfg.lat_iters * static_cast<double>(cfg.lat_size);
}

std::vector<ExpectedRow> expected_p2p_rows(const std::vector<std::vector<int>>& rounds,
                                           const std::vector<std::string>& nodes) {
  std::vector<ExpectedRow> out;
  for (const auto& round : rounds) {
    for (int a = 0; a < static_cast<int>(round.size()); ++a) {
      int b = round[static_cast<size_t>(a)];
      if (b < 0 || b < a) continue;
      const std::string& na = nodes[static_cast<size_t>(a)];
      const std::string& nb = nodes[static_cast<size_t>(b)];
      out.push_back({"latency", na + "<->" + nb, a, a, b});
      out.push_back({"bandwidth", na + "->" + nb, a, a, b});
      out.push_back({"bandwidth", nb + "->" + na, b, a, b});
      out.push_back({"bidir_bandwidth", na + "<->" + nb, a, a, b});
      out.push_back({"data", nb + "->" + na, a, a, b});
      out.push_back({"data", na + "->" + nb, b, a, b});
    }
  }
  return out;
}

}  // namespace hpct::healthcheck
