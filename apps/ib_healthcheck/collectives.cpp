// All-reduce and all-to-all, nccl-tests style, on host buffers over MPI ("allreduce": NCCL's ring
// over MPI point-to-point, hpct::comm::RingAllreduce; "alltoall": MPI_Ialltoall)
// or on device buffers over NCCL ("nccl_allreduce", "nccl_alltoall", CUDA builds, one GPU per
// rank): out-of-place, float, verifiable data (each element a small integer computed from (rank,
// index), so sums are exact), verified before timing, then `iters` operations timed together.
// Each rank reports its own time per operation; rank 0 takes the slowest (a collective ends when
// its last rank does).
#include <algorithm>
#include <cmath>
#include <optional>

#include "checks.hpp"
#include "hpct/comm/deadline.hpp"
#include "hpct/comm/gpu.hpp"
#include "hpct/comm/mpi.hpp"
#include "hpct/comm/ring_allreduce.hpp"
#include "hpct/core/units.hpp"

namespace hpct::healthcheck {
namespace {

float value_of(int rank, size_t i) { return static_cast<float>((static_cast<size_t>(rank) * 7 + i * 13) % 61); }

struct CollectiveTimeout {};

}  // namespace

std::vector<uint64_t> size_sweep(uint64_t lo, uint64_t hi) {
  std::vector<uint64_t> out;
  for (uint64_t s = lo; s < hi; s *= 2) out.push_back(s);
  out.push_back(hi);
  return out;
}

// As many iterations as move 256 MiB, between 2 and max_iters: small sizes are cheap, large ones
// are long enough to time with two.
int collective_iters(uint64_t bytes, int max_iters) {
  return static_cast<int>(std::clamp<uint64_t>((uint64_t(1) << 28) / std::max<uint64_t>(bytes, 1), 2,
                                               static_cast<uint64_t>(std::max(max_iters, 2))));
}

double collective_weight(uint64_t bytes, int max_iters) {
  return 2.0 * static_cast<double>(bytes) * (collective_iters(bytes, max_iters) + 2);
}

bool is_collective(const std::string& check) {
  return check == "allreduce" || check == "alltoall" || check == "nccl_allreduce" || check == "nccl_alltoall";
}

double busbw_factor(const std::string& kind, int n) {
  if (n < 2) return 0;
  return kind == "allreduce" || kind == "nccl_allreduce" ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
}

uint64_t collective_bytes(const std::string& kind, uint64_t size, int n) {
  uint64_t floats = std::max<uint64_t>(size / 4, 1);
  if (kind == "alltoall" || kind == "nccl_alltoall") floats = std::max<uint64_t>(floats / static_cast<uint64_t>(n), 1) * static_cast<uint64_t>(n);
  return floats * 4;
}

nlohmann::json run_collective(FabricContext& ctx, const std::string& kind, const std::vector<uint64_t>& sizes,
                              int max_iters, Progress* progress, bool& timed_out) {
  nlohmann::json rows = nlohmann::json::array();
  const int n = ctx.size;
  const Fault* fault = ctx.fault(kind);
  const bool lossy = fault && fault->kind == Fault::Kind::lossy;
  const std::string timeout_text = "timeout: the collective did not complete within " +
                                   std::to_string(static_cast<int>(ctx.timeout_s)) + " s";
  const bool nccl = kind.rfind("nccl_", 0) == 0;
  const bool reduce = kind == "allreduce" || kind == "nccl_allreduce";
  std::unique_ptr<comm::NcclComm> dev;
  std::optional<comm::RingAllreduce> ring;  // its scratch only for the host all-reduce
  if (kind == "allreduce") ring.emplace(ctx.data);
  std::string setup_error;  // NCCL could not start: every size reports it
  if (nccl) {
    dev = comm::NcclComm::create(ctx.data, ctx.local_rank, ctx.deadline(), ctx.poll, &setup_error);
    if (!dev && setup_error.find("deadline") != std::string::npos) timed_out = true;
  }
  for (size_t si = 0; si < sizes.size(); ++si) {
    if (si == std::min<size_t>(1, sizes.size() - 1)) ctx.maybe_stop(kind);  // hang/die: mid-check
    const uint64_t bytes = collective_bytes(kind, sizes[si], n);
    const size_t count = bytes / 4;  // floats per rank
    nlohmann::json row = {{"check", kind}, {"metric", "time"}, {"rank", ctx.rank},
                          {"node", ctx.nodes[static_cast<size_t>(ctx.rank)]}, {"size", bytes}, {"count", count},
                          {"value", nullptr}, {"wrong", nullptr}, {"error", ""}};
    if (timed_out || (nccl && !dev)) {
      row["error"] = nccl && !dev ? "NCCL not started: " + setup_error : "not run after an earlier timeout";
      rows.push_back(row);
      continue;
    }
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i) in[i] = value_of(ctx.rank, i);
    if (lossy) in[count / 2] += 1.0f;
    std::string dev_error;
    auto op = [&]() {
      if (nccl) {
        bool ok = reduce ? dev->start_allreduce(count, &dev_error) : dev->start_alltoall(count, &dev_error);
        if (!ok || !dev->wait(ctx.deadline(), &dev_error)) throw CollectiveTimeout{};
        return;
      }
      if (reduce) {
        if (!ring->run(in.data(), out.data(), count, ctx.deadline(), ctx.poll)) throw CollectiveTimeout{};
        return;
      }
      MPI_Request r;
      HPCT_CHECK_MPI(MPI_Ialltoall(in.data(), static_cast<int>(count / n), MPI_FLOAT, out.data(),
                                   static_cast<int>(count / n), MPI_FLOAT, ctx.data, &r));
      if (!comm::wait_all_until(&r, 1, ctx.deadline(), ctx.poll)) throw CollectiveTimeout{};
    };
    try {
      // Verify first.
      if (nccl && (!dev->resize(count, &dev_error) || !dev->upload(in.data(), count, &dev_error))) throw CollectiveTimeout{};
      op();
      if (nccl && !dev->download(out.data(), count, &dev_error)) throw CollectiveTimeout{};
      size_t wrong = 0;
      if (reduce) {
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int q = 0; q < n; ++q) want += value_of(q, i);
          wrong += out[i] != want;
        }
      } else {
        const size_t blk = count / static_cast<size_t>(n);
        for (int q = 0; q < n; ++q)
          for (size_t j = 0; j < blk; ++j)
            wrong += out[static_cast<size_t>(q) * blk + j] != value_of(q, static_cast<size_t>(ctx.rank) * blk + j);
      }
      if (lossy) in[count / 2] -= 1.0f;
      if (lossy && nccl && !dev->upload(in.data(), count, &dev_error)) throw CollectiveTimeout{};
      row["wrong"] = wrong;
      // Warm-up (also the slow fault's reference time), then the timed batch.
      double t0 = comm::steady_seconds();
      op();
      double ref = comm::steady_seconds() - t0;
      const int iters = collective_iters(bytes, max_iters);
      t0 = comm::steady_seconds();
      for (int it = 0; it < iters; ++it) {
        slow_down(fault, ref);
        op();
      }
      row["value"] = (comm::steady_seconds() - t0) / iters;
      row["iters"] = iters;
    } catch (const CollectiveTimeout&) {
      timed_out = true;  // an NCCL failure aborts the communicator: nothing more can run on it
      row["error"] = dev_error.empty() ? timeout_text : dev_error;
      comm::keep_until_exit(std::move(in));
      comm::keep_until_exit(std::move(out));
    }
    rows.push_back(row);
    if (progress) progress->done(kind + " " + format_bytes(static_cast<double>(bytes)), collective_weight(bytes, max_iters));
  }
  return rows;
}

}  // namespace hpct::healthcheck
