// The NVMe swap store (lib/io/swap_store): K arrays written and read back with sizes that are not
// multiples of the block or the tile; ranges at unaligned offsets, element by element; sweeps equal
// to the same function in memory for several tile sizes and buffer counts, with the pipeline's own
// counters showing tile i+1's read in flight while fn(tile i) runs; every path check (missing,
// a file, read-only, no O_DIRECT, too little space) by its message; and IO errors mid-sweep (a file
// truncated under the store, a full filesystem) coming back as hpct::Error. The mount tests need
// root and skip, saying why, without it.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/core/units.hpp"
#include "hpct/io/async_io.hpp"
#include "hpct/io/swap_store.hpp"
#include "io_test_util.hpp"

namespace fs = std::filesystem;
using namespace hpct::io;

namespace {

using hpct::io::testing::available_engines;

// The engine the default `auto` stands for on this kernel.
AioEngine default_engine() { return resolve_engine(AioEngine::automatic); }

class SwapStoreTest : public hpct::io::testing::ScratchDirTest {
 protected:
  SwapStoreTest() : ScratchDirTest("hpct_swap") {}
  SwapStoreConfig config(int K, uint64_t n, size_t chunk = 1 << 20, int buffers = 4) const {
    SwapStoreConfig c;
    c.nvme_path = dir_.string();
    c.tag = "t";
    c.num_arrays = K;
    c.elems = n;
    c.chunk_elems = chunk;
    c.buffer_count = buffers;
    c.aio.engine = default_engine();
    return c;
  }
};

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Exact comparison, element by element, with the first mismatch named.
void expect_equal(const std::vector<float>& want, const float* got, size_t n, const std::string& what) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(&want[i], &got[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
      return;
    }
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const hpct::Error& e) {
    return e.what();
  }
  return "no error";
}

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << "missing '" << (part) << "' in: " << (text)

// An Adam-like update on one element of (param, m, v), the kind of tile function the optimizer runs.
// Not inlined: the sweep and the in-memory loop must run the same instructions (no FMA contracted in
// one and not the other) for the comparison to be exact.
__attribute__((noinline)) void adam_like(float& p, float& m, float& v, uint64_t idx) {
  float g = 0.001f * static_cast<float>(idx % 97) - 0.05f;
  m = 0.9f * m + 0.1f * g;
  v = 0.999f * v + 0.001f * g * g;
  p -= 0.01f * m / (std::sqrt(std::fabs(v)) + 1e-8f);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Layout and round trips

TEST_F(SwapStoreTest, RoundTripOfKArraysEveryEngine) {
  const uint64_t n = 12345;  // not a multiple of 1024 elements (one 4 KiB block) nor of the tile
  for (AioEngine e : available_engines()) {
    SwapStoreConfig c = config(3, n, 3000);
    c.aio.engine = e;
    c.aio.block_size = 16384;  // several pieces per tile
    c.tag = std::string("rt_") + engine_name(e);
    std::vector<std::vector<float>> want;
    std::string path;
    {
      SwapStore s(c);
      path = s.path();
      EXPECT_HAS(path, dir_.string() + "/hpct_swap.rt_");
      EXPECT_EQ(s.chunk_elems(), 3072u) << "tiles are whole 4 KiB blocks";
      EXPECT_EQ(s.num_chunks(), 5u);
      EXPECT_EQ(fs::file_size(path), SwapStore::file_bytes(3, n)) << "preallocated";
      EXPECT_EQ(SwapStore::file_bytes(3, n), 3u * 13u * 4096u);
      for (int k = 0; k < 3; ++k) {
        want.push_back(random_floats(n, 100 + k));
        s.load(k, want[k].data());
      }
      for (int k = 0; k < 3; ++k) {
        std::vector<float> got(n, -7.f);
        s.store_to(k, got.data());
        expect_equal(want[k], got.data(), n, std::string(engine_name(e)) + " array " + std::to_string(k));
      }
    }
    EXPECT_FALSE(fs::exists(path)) << "the file is removed at destruction";
  }
}

TEST_F(SwapStoreTest, KeepFileAndSeveralStoresPerRank) {
  SwapStoreConfig a = config(1, 5000), b = config(2, 777);
  a.tag = "optim.rank0";
  b.tag = "param.rank0";
  a.keep_file = true;
  std::string pa, pb;
  {
    SwapStore sa(a), sb(b);
    pa = sa.path();
    pb = sb.path();
    EXPECT_NE(pa, pb);
    auto va = random_floats(5000, 1), vb = random_floats(777, 2);
    sa.load(0, va.data());
    sb.load(1, vb.data());
    std::vector<float> ga(5000), gb(777);
    sa.store_to(0, ga.data());
    sb.store_to(1, gb.data());
    expect_equal(va, ga.data(), 5000, "store a");
    expect_equal(vb, gb.data(), 777, "store b");
  }
  EXPECT_TRUE(fs::exists(pa)) << "keep_file leaves the file";
  EXPECT_FALSE(fs::exists(pb));
  // A kept file of the same tag is replaced (emptied) by the next store, and its space counts as free.
  SwapStore again(a);
  EXPECT_EQ(fs::file_size(again.path()), SwapStore::file_bytes(1, 5000));
}

// Ranges at unaligned offsets and lengths, against an in-memory copy, element by element; reads into
// unaligned destinations, writes from unaligned sources, and the zero-copy aligned case.
TEST_F(SwapStoreTest, RangeReadWriteAtUnalignedOffsets) {
  const uint64_t n = 10007;
  SwapStore s(config(2, n, 1024));  // tile 1024: long writes go through several bounce pieces
  std::vector<std::vector<float>> mem = {random_floats(n, 7), random_floats(n, 8)};
  s.load(0, mem[0].data());
  s.load(1, mem[1].data());
  struct R {
    uint64_t begin;
    size_t count;
  };
  const std::vector<R> ranges = {{0, 1},       {1, 1},      {1023, 1},   {1023, 2},    {1023, 1026}, {5, 3},
                                 {1000, 3000}, {5, 9990},   {10006, 1},  {0, 10007},   {1024, 1024}, {2048, 4096},
                                 {3, 2048},    {4095, 4097}, {9000, 1007}, {10000, 7}};
  std::mt19937_64 g(3);
  std::vector<float> src(n + 16), got(n + 16);
  int round = 0;
  for (const R& r : ranges) {
    for (int k = 0; k < 2; ++k, ++round) {
      // Write from an unaligned source (offset by one float), then read back through an unaligned dst.
      auto vals = random_floats(r.count, 1000 + round);
      std::memcpy(src.data() + 1, vals.data(), r.count * sizeof(float));
      s.write(k, r.begin, src.data() + 1, r.count);
      std::copy(vals.begin(), vals.end(), mem[k].begin() + static_cast<long>(r.begin));
      s.read(k, r.begin, r.count, got.data() + 3);
      expect_equal(vals, got.data() + 3, r.count,
                   "range [" + std::to_string(r.begin) + ", +" + std::to_string(r.count) + ") of array " + std::to_string(k));
    }
    // The neighbours of every edge are untouched: the whole of both arrays still matches.
    for (int k = 0; k < 2; ++k) {
      s.store_to(k, got.data());
      expect_equal(mem[k], got.data(), n, "whole array " + std::to_string(k) + " after range " + std::to_string(r.begin));
    }
  }
  // Aligned offset, length and buffers: straight into / out of the caller's memory.
  AlignedBuffer ab(4096 * 2);
  auto* af = reinterpret_cast<float*>(ab.data());
  for (size_t i = 0; i < 2048; ++i) af[i] = static_cast<float>(i) * 0.5f;
  s.write(1, 2048, af, 2048);
  std::copy(af, af + 2048, mem[1].begin() + 2048);
  std::memset(ab.data(), 0, ab.size());
  s.read(1, 2048, 2048, af);
  expect_equal(std::vector<float>(mem[1].begin() + 2048, mem[1].begin() + 4096), af, 2048, "aligned range");
  s.store_to(1, got.data());
  expect_equal(mem[1], got.data(), n, "array 1 after the aligned write");

  // Out of range is an error, not a silent clip.
  std::string msg = error_of([&] { s.read(0, n - 1, 2, got.data()); });
  EXPECT_HAS(msg, "outside the 10007");
  msg = error_of([&] { s.write(2, 0, got.data(), 1); });
  EXPECT_HAS(msg, "array 2 of a store with 2 arrays");
}

TEST_F(SwapStoreTest, AsyncReadOverlapsAndFinishIsIdempotent) {
  const uint64_t n = 50000;
  SwapStore s(config(1, n));
  auto v = random_floats(n, 11);
  s.load(0, v.data());
  std::vector<float> a(20000), b(777);
  PendingRead ra = s.start_read(0, 13, 20000, a.data());
  PendingRead rb = s.start_read(0, 40001, 777, b.data());
  EXPECT_TRUE(ra.active());
  s.finish_read(rb);  // in any order
  s.finish_read(ra);
  EXPECT_FALSE(ra.active());
  s.finish_read(ra);  // idempotent
  expect_equal(std::vector<float>(v.begin() + 13, v.begin() + 13 + 20000), a.data(), 20000, "async a");
  expect_equal(std::vector<float>(v.begin() + 40001, v.begin() + 40001 + 777), b.data(), 777, "async b");
  {
    PendingRead dropped = s.start_read(0, 0, 1000, a.data());  // destroyed unfinished: waits, no leak, no crash
  }
  PendingRead empty;
  s.finish_read(empty);
}

// ---------------------------------------------------------------------------------------------
// The sweep

struct SweepCase {
  size_t chunk;
  int buffers;
};

class SweepTest : public SwapStoreTest, public ::testing::WithParamInterface<SweepCase> {};

TEST_P(SweepTest, EqualsTheSameFunctionInMemory) {
  const auto [chunk, buffers] = GetParam();
  const uint64_t n = 20007;
  SwapStore s(config(3, n, chunk, buffers));
  std::vector<std::vector<float>> mem;
  for (int k = 0; k < 3; ++k) {
    mem.push_back(random_floats(n, 50 + k));
    s.load(k, mem[k].data());
  }
  // Two optimizer-like steps, read and write every array.
  for (int step = 0; step < 2; ++step) {
    size_t next_begin = 0;
    SweepStats st = s.sweep(s.all_arrays(), s.all_arrays(), [&](const SweepChunk& c) {
      EXPECT_EQ(c.begin, next_begin) << "tiles in order, without gaps";
      next_begin = c.begin + c.count;
      float *p = c.array(0), *m = c.array(1), *v = c.array(2);
      for (size_t i = 0; i < c.count; ++i) adam_like(p[i], m[i], v[i], c.begin + i);
    });
    EXPECT_EQ(next_begin, n);
    EXPECT_EQ(st.chunks, s.num_chunks());
    EXPECT_EQ(st.bytes_read, 3 * n * sizeof(float));
    EXPECT_EQ(st.bytes_written, 3 * n * sizeof(float));
    EXPECT_GT(st.wall_seconds, 0);
    EXPECT_LE(st.io_wait_seconds + st.compute_seconds, st.wall_seconds * 1.01 + 1e-3);
    for (uint64_t i = 0; i < n; ++i) adam_like(mem[0][i], mem[1][i], mem[2][i], i);
  }
  std::vector<float> got(n);
  for (int k = 0; k < 3; ++k) {
    s.store_to(k, got.data());
    expect_equal(mem[k], got.data(), n, "array " + std::to_string(k) + " after two sweeps");
  }

  // Mixed masks: read 0 and 1, write 2 only (2's buffer is not read: overwritten in full).
  const ArrayMask r01 = 0b011, w2 = 0b100;
  SweepStats st = s.sweep(r01, w2, [&](const SweepChunk& c) {
    for (size_t i = 0; i < c.count; ++i) c.array(2)[i] = c.array(0)[i] + 2.f * c.array(1)[i];
  });
  EXPECT_EQ(st.bytes_read, 2 * n * sizeof(float));
  EXPECT_EQ(st.bytes_written, n * sizeof(float));
  for (uint64_t i = 0; i < n; ++i) mem[2][i] = mem[0][i] + 2.f * mem[1][i];

  // Write-only (initialisation) pass on array 1, and a read-only pass that only looks.
  s.sweep(0, 0b010, [&](const SweepChunk& c) {
    EXPECT_EQ(c.array(0), nullptr) << "arrays in neither mask get no buffer";
    for (size_t i = 0; i < c.count; ++i) c.array(1)[i] = static_cast<float>(c.begin + i) * 0.25f;
  });
  for (uint64_t i = 0; i < n; ++i) mem[1][i] = static_cast<float>(i) * 0.25f;
  double sum = 0, want_sum = 0;
  st = s.sweep(s.all_arrays(), 0, [&](const SweepChunk& c) {
    for (size_t i = 0; i < c.count; ++i) sum += c.array(0)[i] + c.array(1)[i] + c.array(2)[i];
  });
  EXPECT_EQ(st.bytes_written, 0u);
  for (uint64_t i = 0; i < n; ++i) want_sum += mem[0][i] + mem[1][i] + mem[2][i];
  EXPECT_EQ(sum, want_sum);
  for (int k = 0; k < 3; ++k) {
    s.store_to(k, got.data());
    expect_equal(mem[k], got.data(), n, "array " + std::to_string(k) + " after the masked sweeps");
  }
}

INSTANTIATE_TEST_SUITE_P(TilesAndBuffers, SweepTest,
                         ::testing::Values(SweepCase{1024, 1}, SweepCase{1024, 2}, SweepCase{1024, 3}, SweepCase{3000, 4},
                                           SweepCase{5000, 5}, SweepCase{2048, 8}, SweepCase{1 << 20, 4}),
                         [](const auto& info) {
                           return "chunk" + std::to_string(info.param.chunk) + "_buffers" + std::to_string(info.param.buffers);
                         });

// The pipeline's own counters, seen from inside fn(tile i): tile i+1's read (and with 4 slots tile
// i+2's) was already handed to the engine, and tile i-1's write-back was submitted and not yet waited
// for. With one slot nothing overlaps: the counters show the serial order.
TEST_F(SwapStoreTest, SweepPipelineOverlaps) {
  const uint64_t n = 1024 * 10;
  for (int buffers : {1, 2, 3, 4}) {
    SwapStore s(config(2, n, 1024, buffers));
    const size_t nc = s.num_chunks();
    ASSERT_EQ(nc, 10u);
    size_t overlapped_reads = 0, overlapped_writes = 0;
    s.sweep(s.all_arrays(), s.all_arrays(), [&](const SweepChunk& c) {
      const size_t i = c.index;
      EXPECT_EQ(c.writes_submitted, i);
      const size_t ahead = buffers == 1 ? 0 : buffers == 2 ? 1 : static_cast<size_t>(buffers - 2);
      EXPECT_EQ(c.reads_submitted, std::min(nc, i + 1 + ahead)) << "buffers " << buffers << " tile " << i;
      if (c.reads_submitted > i + 1) ++overlapped_reads;
      if (c.writes_finished < c.writes_submitted) ++overlapped_writes;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    if (buffers == 1) {
      EXPECT_EQ(overlapped_reads, 0u);
      EXPECT_EQ(overlapped_writes, 0u);
    } else {
      EXPECT_EQ(overlapped_reads, nc - 1) << "every tile but the last had the next one's read in flight";
      if (buffers >= 3) {
        EXPECT_EQ(overlapped_writes, nc - 1) << "tile i-1's write-back in flight during fn(i)";
      }
    }
  }
}

TEST_F(SwapStoreTest, ExceptionFromTheFunctionPropagatesAndTheStoreStaysUsable) {
  const uint64_t n = 8192;
  SwapStore s(config(1, n, 1024, 4));
  auto v = random_floats(n, 5);
  s.load(0, v.data());
  EXPECT_THROW(s.sweep(1, 1,
                       [&](const SweepChunk& c) {
                         if (c.index == 3) throw std::runtime_error("boom");
                         for (size_t i = 0; i < c.count; ++i) c.array(0)[i] += 1.f;
                       }),
               std::runtime_error);
  for (size_t i = 0; i < 3 * 1024; ++i) v[i] += 1.f;  // tiles before the failing one were written back
  std::vector<float> got(n);
  s.store_to(0, got.data());
  expect_equal(v, got.data(), n, "after the failed sweep");
}

// Bandwidth of a do-nothing sweep next to plain sequential AsyncIo on the same directory. Printed,
// not asserted (shared CI disks vary); HPCT_SWAP_BENCH_MB sets the size (default 96 MiB),
// HPCT_SWAP_BENCH_K the arrays (3), HPCT_SWAP_BENCH_TILE the tile in elements (1M).
TEST_F(SwapStoreTest, SweepBandwidthNextToPlainSequentialIo) {
  const char* env = std::getenv("HPCT_SWAP_BENCH_MB");
  const uint64_t mb = env ? std::strtoull(env, nullptr, 10) : 96;
  const int K = std::getenv("HPCT_SWAP_BENCH_K") ? std::atoi(std::getenv("HPCT_SWAP_BENCH_K")) : 3;
  const size_t tile = std::getenv("HPCT_SWAP_BENCH_TILE") ? std::strtoull(std::getenv("HPCT_SWAP_BENCH_TILE"), nullptr, 10) : 1 << 20;
  const uint64_t n = mb * (1ull << 20) / sizeof(float) / K;
  SwapStoreConfig c = config(K, n, tile, 4);  // default 4 MiB tiles per array (HPCT_SWAP_BENCH_TILE elements)
  SwapStore s(c);
  SweepStats w = s.sweep(0, s.all_arrays(), [&](const SweepChunk& ch) {
    for (int k = 0; k < K; ++k) std::memset(ch.array(k), 0, ch.count * sizeof(float));
  });
  SweepStats r = s.sweep(s.all_arrays(), 0, [](const SweepChunk&) {});
  SweepStats rw = s.sweep(s.all_arrays(), s.all_arrays(), [](const SweepChunk&) {});

  // Plain sequential write then read of the same bytes, 16 MiB requests, two in flight.
  const uint64_t bytes = SwapStore::file_bytes(K, n);
  IoFile f = IoFile::open((dir_ / "plain.bin").string(), IoFile::Mode::read_write, true, true);
  f.allocate(bytes);
  AsyncIo io(c.aio);
  const size_t req = 16 << 20;
  AlignedBuffer bufs[2] = {AlignedBuffer(req), AlignedBuffer(req)};
  std::memset(bufs[0].data(), 0, req);
  std::memset(bufs[1].data(), 0, req);
  auto stream = [&](bool write) {
    auto t0 = std::chrono::steady_clock::now();
    AsyncIo::Ticket t[2] = {0, 0};
    for (uint64_t off = 0, i = 0; off < bytes; off += req, ++i) {
      size_t b = i % 2;
      if (t[b]) io.wait(t[b]);
      size_t len = static_cast<size_t>(std::min<uint64_t>(req, bytes - off));
      t[b] = write ? io.submit_write(f, bufs[b].data(), len, off) : io.submit_read(f, bufs[b].data(), len, off);
    }
    io.wait_all();
    return bytes / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
  };
  double pw = stream(true), pr = stream(false);
  std::printf("[ bench ] %.0f MiB in %d arrays, 4 MiB tiles, 4 slots, %s\n", static_cast<double>(bytes) / (1 << 20), K,
              c.aio.describe().c_str());
  std::printf("[ bench ] sweep write-only %.2f GB/s | read-only %.2f GB/s | read+write %.2f + %.2f GB/s (io wait %.3f s of %.3f s)\n",
              w.write_gbps(), r.read_gbps(), rw.read_gbps(), rw.write_gbps(), rw.io_wait_seconds, rw.wall_seconds);
  std::printf("[ bench ] plain AsyncIo sequential write %.2f GB/s | read %.2f GB/s\n", pw, pr);
  EXPECT_EQ(rw.bytes_read, static_cast<uint64_t>(K) * n * sizeof(float));

  // The overlap in time: an Adam-like tile function, serial (1 slot) and pipelined (4 slots).
  for (int buffers : {1, 4}) {
    if (K != 3) break;
    SwapStoreConfig cb = config(K, n, 1 << 20, buffers);
    cb.tag = "b" + std::to_string(buffers);
    SwapStore sb(cb);
    sb.sweep(0, sb.all_arrays(), [](const SweepChunk& ch) {
      for (int k = 0; k < 3; ++k) std::memset(ch.array(k), 0, ch.count * sizeof(float));
    });
    SweepStats st = sb.sweep(sb.all_arrays(), sb.all_arrays(), [](const SweepChunk& ch) {
      for (size_t i = 0; i < ch.count; ++i) adam_like(ch.array(0)[i], ch.array(1)[i], ch.array(2)[i], ch.begin + i);
    });
    std::printf("[ bench ] adam sweep, %d slot(s): wall %.3f s = compute %.3f s + io wait %.3f s (+ rest); %.2f + %.2f GB/s\n",
                buffers, st.wall_seconds, st.compute_seconds, st.io_wait_seconds, st.read_gbps(), st.write_gbps());
  }
}

// ---------------------------------------------------------------------------------------------
// Path checks: each a one-line error naming the path, before anything is written.

TEST_F(SwapStoreTest, MissingDirectory) {
  SwapStoreConfig c = config(1, 100);
  c.nvme_path = (dir_ / "no" / "such").string();
  c.config_key = "offload_optimizer.nvme_path";
  std::string msg = error_of([&] { SwapStore s(c); });
  EXPECT_HAS(msg, c.nvme_path + ": does not exist");
  EXPECT_HAS(msg, "key: offload_optimizer.nvme_path");
  EXPECT_HAS(msg, "mkdir -p");
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line";
}

TEST_F(SwapStoreTest, FileInsteadOfDirectory) {
  fs::path file = dir_ / "a_file";
  { std::FILE* f = std::fopen(file.c_str(), "w"); std::fclose(f); }
  SwapStoreConfig c = config(1, 100);
  c.nvme_path = file.string();
  std::string msg = error_of([&] { SwapStore s(c); });
  EXPECT_HAS(msg, file.string() + ": is not a directory");
}

TEST_F(SwapStoreTest, ReadOnlyDirectory) {
  if (::geteuid() != 0) {  // permissions stop a normal user (root passes them: it needs a read-only mount)
    fs::path d = dir_ / "ro";
    fs::create_directories(d);
    fs::permissions(d, fs::perms::owner_read | fs::perms::owner_exec);
    SwapStoreConfig c = config(1, 100);
    c.nvme_path = d.string();
    std::string msg = error_of([&] { SwapStore s(c); });
    fs::permissions(d, fs::perms::owner_all);
    EXPECT_HAS(msg, d.string() + ": is not writable (Permission denied)");
    return;
  }
  std::string why;
  std::string m = mount_fs("tmpfs", "size=4m", &why);
  if (m.empty()) GTEST_SKIP() << why;
  if (::mount("none", m.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) != 0)
    GTEST_SKIP() << "cannot remount the tmpfs read-only: " << std::strerror(errno);
  SwapStoreConfig c = config(1, 100);
  c.nvme_path = m;
  std::string msg = error_of([&] { SwapStore s(c); });
  EXPECT_HAS(msg, m + ": is not writable (Read-only file system)");
  EXPECT_HAS(msg, "read-write mount");
}

TEST_F(SwapStoreTest, FilesystemRefusingDirectIo) {
  // tmpfs takes O_DIRECT since Linux 6.6; ramfs refuses it at open.
  std::string why;
  std::string m = mount_fs("ramfs", "", &why);
  if (m.empty()) GTEST_SKIP() << why;
  SwapStoreConfig c = config(1, 100);
  c.nvme_path = m;
  std::string msg = error_of([&] { SwapStore s(c); });
  if (msg == "no error") GTEST_SKIP() << "ramfs accepted O_DIRECT on this kernel; no filesystem here refuses it";
  EXPECT_HAS(msg, m + ": the filesystem (ramfs) refuses O_DIRECT");
  EXPECT_HAS(msg, "aio.direct false");
  EXPECT_TRUE(fs::is_empty(m)) << "nothing left behind";
  // Buffered IO, when asked for, works there (ramfs reports no free space, so ask for nothing).
  c.elems = 0;
  c.aio.direct = false;
  SwapStore s(c);
  EXPECT_EQ(s.num_chunks(), 0u);
}

TEST_F(SwapStoreTest, NotEnoughSpace) {
  std::string why;
  std::string m = mount_fs("tmpfs", "size=1m", &why);
  if (m.empty()) GTEST_SKIP() << why;
  SwapStoreConfig c = config(3, 300000);  // 3 x 1.14 MiB
  c.nvme_path = m;
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs(m.c_str(), &vfs), 0);
  const uint64_t need = SwapStore::file_bytes(3, 300000), avail = uint64_t(vfs.f_bavail) * vfs.f_frsize;
  std::string msg = error_of([&] { SwapStore s(c); });
  EXPECT_HAS(msg, m + ": the swap file needs " + hpct::format_bytes(double(need)) + " (" + std::to_string(need) +
                      " bytes) but only " + hpct::format_bytes(double(avail)) + " (" + std::to_string(avail) +
                      " bytes) are free");
  EXPECT_HAS(msg, "3.43 MiB (3600384 bytes)");  // 3 x 1200000 bytes, each rounded up to 4096
  EXPECT_HAS(msg, "key: nvme_path");
  EXPECT_TRUE(fs::is_empty(m)) << "nothing written before the check";
}

TEST_F(SwapStoreTest, BadConfig) {
  SwapStoreConfig c = config(1, 100);
  c.tag = "a/b";
  EXPECT_HAS(error_of([&] { SwapStore s(c); }), "must be non-empty and contain no '/'");
  c = config(0, 100);
  EXPECT_HAS(error_of([&] { SwapStore s(c); }), "key: num_arrays");
  c = config(1, 100, 1024, 0);
  EXPECT_HAS(error_of([&] { SwapStore s(c); }), "key: buffer_count");
  c = config(1, 100);
  c.aio.queue_depth = 0;
  EXPECT_HAS(error_of([&] { SwapStore s(c); }), "aio.queue_depth");
  c = config(1, 100);
  SwapStore s(c);
  EXPECT_HAS(error_of([&] { s.sweep(0b10, 0, [](const SweepChunk&) {}); }), "beyond the 1 of 't'");
}

// ---------------------------------------------------------------------------------------------
// IO errors mid-sweep

// The file is cut to nothing under the store while tile 0 is computed: a later tile's read hits the
// end of the file and the sweep throws, naming the file, offset and length.
TEST_F(SwapStoreTest, TruncatedFileMidSweepIsAnError) {
  for (AioEngine e : available_engines()) {
    SwapStoreConfig c = config(2, 1024 * 16, 1024, 3);
    c.aio.engine = e;
    SwapStore s(c);
    std::string msg = error_of([&] {
      s.sweep(s.all_arrays(), s.all_arrays(), [&](const SweepChunk& ch) {
        if (ch.index == 0) {
          ASSERT_EQ(::truncate(s.path().c_str(), 0), 0);
        }
      });
    });
    EXPECT_HAS(msg, s.path() + ": read of 4096 bytes at offset ");
    EXPECT_HAS(msg, "end of file");
    EXPECT_HAS(msg, "swap store 't', array ");
    // A range read of the truncated part fails the same way, at finish_read.
    std::vector<float> dst(100);
    PendingRead r = s.start_read(1, 5000, 100, dst.data());
    msg = error_of([&] { s.finish_read(r); });
    EXPECT_HAS(msg, "end of file");
    EXPECT_HAS(msg, "[reading swap store 't', array 1, elements [5000, 5100)]");
  }
}

// A full filesystem: the preallocated blocks are taken away (file truncated, the tmpfs filled by
// another file) while tile 0 is computed, so its write-back gets ENOSPC.
TEST_F(SwapStoreTest, FullDeviceMidSweepIsAnError) {
  std::string why;
  std::string m = mount_fs("tmpfs", "size=4m", &why);
  if (m.empty()) GTEST_SKIP() << why;
  SwapStoreConfig c = config(2, 256 * 1024, 64 * 1024, 3);  // 2 x 1 MiB arrays, 256 KiB tiles
  c.nvme_path = m;
  SwapStore s(c);
  std::string msg = error_of([&] {
    s.sweep(0, s.all_arrays(), [&](const SweepChunk& ch) {
      if (ch.index != 0) return;
      ASSERT_EQ(::truncate(s.path().c_str(), 0), 0);
      int fd = ::open((m + "/filler").c_str(), O_CREAT | O_WRONLY, 0600);
      ASSERT_GE(fd, 0);
      std::vector<char> block(65536, 1);
      while (::write(fd, block.data(), block.size()) > 0) {
      }
      ::close(fd);
    });
  });
  EXPECT_HAS(msg, s.path() + ": write of 262144 bytes at offset 0");
  EXPECT_HAS(msg, "No space left on device");
  EXPECT_HAS(msg, "writing back swap store 't', array 0, elements [0, 65536), tile 0");
}

// A symbolic link planted at the swap file's predictable name (a shared scratch directory) must not
// get the file it points to truncated or overwritten (issue 17, item 7): the store refuses the link
// and the victim keeps its bytes; a stale regular file of that name is replaced, not written into.
TEST_F(SwapStoreTest, PlantedSymlinkIsNeverWrittenThrough) {
  SwapStoreConfig c = config(1, 4096);
  c.tag = "victim";
  const std::string victim = (dir_ / "precious.txt").string();
  {
    std::ofstream v(victim);
    v << "precious data";
  }
  const std::string name = (dir_ / "hpct_swap.victim.bin").string();
  ASSERT_EQ(::symlink(victim.c_str(), name.c_str()), 0);
  std::string err = error_of([&] { SwapStore s(c); });
  EXPECT_HAS(err, "is a symbolic link: refusing to write through it");
  std::ifstream v(victim);
  std::string got((std::istreambuf_iterator<char>(v)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, "precious data");
  // A hard link to the victim at that name: replaced by a new file, the victim untouched.
  ASSERT_EQ(::unlink(name.c_str()), 0);
  ASSERT_EQ(::link(victim.c_str(), name.c_str()), 0);
  {
    SwapStore s(c);
    std::vector<float> x(4096, 1.5f);
    s.write(0, 0, x.data(), x.size());
    s.sync();
  }
  std::ifstream v2(victim);
  std::string got2((std::istreambuf_iterator<char>(v2)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got2, "precious data");
}
