// One storage measurement on one process through the async IO engine (see io_bench.hpp).
#include "hpct/io/io_bench.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "hpct/core/error.hpp"
#include "hpct/core/rng.hpp"
#include "hpct/core/units.hpp"
#include "hpct/io/async_io.hpp"

namespace hpct::io {

const char* mode_name(IoMode m) {
  switch (m) {
    case IoMode::write: return "write";
    case IoMode::read: return "read";
    case IoMode::randread: return "randread";
  }
  return "?";
}

IoMode parse_mode(const std::string& text, const std::string& key) {
  if (text == "write") return IoMode::write;
  if (text == "read") return IoMode::read;
  if (text == "randread") return IoMode::randread;
  throw config_error(key, "unknown mode '" + text + "'", "use write, read or randread");
}

namespace {

uint64_t stamp_word(uint64_t off, uint64_t seed) { return off ^ splitmix64(seed ^ 0x5354414d50ull); }

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

uint64_t gcd(uint64_t a, uint64_t b) { return b ? gcd(b, a % b) : a; }

}  // namespace

void fill_pattern(char* dst, size_t len, uint64_t off, uint64_t seed) {
  HPCT_REQUIRE(off % 4096 == 0, "fill_pattern: offset must be a multiple of 4096");
  for (size_t i = 0; i < len; i += 8) {
    uint64_t w = splitmix64(seed + ((off + i) % kPatternPeriod) / 8);
    std::memcpy(dst + i, &w, std::min<size_t>(8, len - i));
  }
  stamp_pattern(dst, len, off, seed);
}

void stamp_pattern(char* dst, size_t len, uint64_t off, uint64_t seed) {
  for (size_t i = 0; i < len; i += 4096) {
    uint64_t w = stamp_word(off + i, seed);
    std::memcpy(dst + i, &w, std::min<size_t>(8, len - i));
  }
}

uint64_t stream_chunk_bytes(const AioConfig& aio, uint64_t size) {
  uint64_t inflight = static_cast<uint64_t>(aio.block_size) * aio.queue_depth * aio.thread_count;
  uint64_t want = std::max<uint64_t>(inflight, 16ull << 20);
  // A multiple of the block size (whole pieces) and of the pattern period (buffers stay valid).
  uint64_t unit = aio.block_size / gcd(aio.block_size, kPatternPeriod) * kPatternPeriod;
  uint64_t chunk = (want + unit - 1) / unit * unit;
  uint64_t size_up = (size + unit - 1) / unit * unit;
  return std::max<uint64_t>(unit, std::min(chunk, size_up));
}

StreamRing stream_ring(const AioConfig& aio, uint64_t size) {
  const uint64_t bs = aio.block_size;
  const uint64_t nreq = std::max<uint64_t>(1, (size + bs - 1) / bs);
  const uint64_t want = (static_cast<uint64_t>(aio.queue_depth) + 1) * static_cast<uint64_t>(aio.thread_count);
  if (want >= nreq) return {static_cast<size_t>(nreq), true};  // no buffer is used twice
  // Requests k and k + slots share a buffer: their offsets must share a phase of the pattern period.
  const uint64_t phases = kPatternPeriod / gcd(bs, kPatternPeriod);
  const uint64_t rounded = (want + phases - 1) / phases * phases;
  if (rounded <= std::max<uint64_t>(2 * want, (64ull << 20) / bs)) return {static_cast<size_t>(std::min(rounded, nreq)), true};
  return {static_cast<size_t>(want), false};  // an odd block size: regenerate each write's data instead
}

double percentile(std::vector<uint64_t>& v, double q) {
  if (v.empty()) return -1;
  size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  k = std::clamp<size_t>(k, 1, v.size()) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return static_cast<double>(v[k]);
}

void drop_file_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

namespace {

void set_percentiles(IoResult& r, std::vector<uint64_t> lat_ns) {
  r.lat_p50_us = percentile(lat_ns, 0.50) / 1e3;
  r.lat_p99_us = percentile(lat_ns, 0.99) / 1e3;
  r.lat_p999_us = percentile(lat_ns, 0.999) / 1e3;
  r.lat_max_us = percentile(lat_ns, 1.0) / 1e3;
}

IoResult run_stream(const std::string& path, const IoCase& c) {
  const bool write = c.mode == IoMode::write;
  // A write case starts from an empty file (truncated, then preallocated), as fio's job does: an
  // overwrite of blocks already written measures something else (and virtual disks cache it).
  IoFile f = IoFile::open(path, write ? IoFile::Mode::write : IoFile::Mode::read, c.aio.direct, /*truncate=*/write);
  if (write) {
    f.allocate(c.size);
  } else if (f.size() < c.size) {
    throw file_error(path, "has " + std::to_string(f.size()) + " bytes; a read of " + std::to_string(c.size) +
                               " bytes needs the file written first");
  }
  if (!write && !c.aio.direct) drop_file_cache(path);
  // A ring of block-sized buffers, one request each, as fio's iodepth buffers: queue_depth per
  // thread in flight plus one queued per thread, so each worker has its next request while the
  // caller refills a finished buffer. The footprint matters on virtual disks: the host copies every
  // write out of guest memory, and a 32 MiB buffer set wrote 1M QD 1 at 0.82 of fio's rate where
  // fio's own 1 MiB buffer stays in cache (docs/benchmarks/checkpoints-io.md).
  const uint64_t bs = c.aio.block_size;
  const StreamRing plan = stream_ring(c.aio, c.size);
  const size_t slots = plan.slots;
  AlignedBuffer ring(slots * bs, c.aio.pin_buffers);
  if (write) {
    // Buffer i first carries request i. With plan.restamp, every later request it carries has an
    // offset of the same phase in the pattern period, so its data differs only in the stamps.
    for (size_t i = 0; i < slots; ++i) fill_pattern(ring.data() + i * bs, bs, i * bs, c.seed);
  } else {
    std::memset(ring.data(), 0, ring.size());  // touch the pages before the clock starts
  }
  // After the file and the buffers: destroyed first, it waits for IO still in flight on them.
  AsyncIo io(c.aio);
  io.record_latencies(c.record_latency);

  IoResult r;
  std::vector<AsyncIo::Ticket> ticket(slots, 0);
  std::vector<uint64_t> len_of(slots, 0);
  const uint64_t nreq = (c.size + bs - 1) / bs;
  auto retire = [&](size_t i) {
    io.wait(ticket[i]);
    ticket[i] = 0;
    r.bytes += len_of[i];
    ++r.requests;
  };
  double t0 = now_s(), cpu0 = cpu_s();
  for (uint64_t k = 0; k < nreq; ++k) {
    if (c.runtime > 0 && now_s() - t0 > c.runtime) break;
    const size_t i = static_cast<size_t>(k % slots);
    if (ticket[i]) retire(i);
    char* buf = ring.data() + i * bs;
    uint64_t off = k * bs, len = std::min(bs, c.size - off);
    if (write) {
      if (k >= slots) {  // the first pass was filled above
        if (plan.restamp) stamp_pattern(buf, len, off, c.seed);
        else fill_pattern(buf, len, off, c.seed);
      }
      ticket[i] = io.submit_write(f, buf, len, off);
    } else {
      ticket[i] = io.submit_read(f, buf, len, off);
    }
    len_of[i] = len;
  }
  for (size_t i = 0; i < slots; ++i)
    if (ticket[i]) retire(i);
  if (write && c.fsync) f.sync();
  r.seconds = now_s() - t0;
  r.cpu_seconds = cpu_s() - cpu0;
  if (c.record_latency) set_percentiles(r, io.take_latencies_ns());
  return r;
}

IoResult run_randread(const std::string& path, const IoCase& c) {
  IoFile f = IoFile::open(path, IoFile::Mode::read, c.aio.direct);
  if (f.size() < c.size)
    throw file_error(path, "has " + std::to_string(f.size()) + " bytes; random reads over " + std::to_string(c.size) +
                               " bytes need the file written first");
  if (!c.aio.direct) drop_file_cache(path);
  const uint64_t bs = c.aio.block_size;
  const uint64_t nblocks = c.size / bs;
  HPCT_REQUIRE(nblocks > 0, "randread: the size is smaller than one block");
  // Every block once, in random order (fio's random map).
  std::vector<uint32_t> order(nblocks);
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937_64 g(c.seed);
  std::shuffle(order.begin(), order.end(), g);
  const size_t window = static_cast<size_t>(c.aio.queue_depth) * c.aio.thread_count;
  AlignedBuffer buf(window * bs, c.aio.pin_buffers);
  std::memset(buf.data(), 0, buf.size());
  std::vector<AsyncIo::Ticket> tickets(window, 0);
  // After the file and the buffers: destroyed first, it waits for IO still in flight on them.
  AsyncIo io(c.aio);
  io.record_latencies(true);
  IoResult r;
  double t0 = now_s(), cpu0 = cpu_s();
  for (uint64_t i = 0; i < nblocks; ++i) {
    if (c.runtime > 0 && now_s() - t0 > c.runtime) break;
    size_t slot = i % window;
    if (tickets[slot]) {
      io.wait(tickets[slot]);
      r.bytes += bs;
      ++r.requests;
    }
    tickets[slot] = io.submit_read(f, buf.data() + slot * bs, bs, static_cast<uint64_t>(order[i]) * bs);
  }
  for (auto t : tickets) {
    if (t) {
      io.wait(t);
      r.bytes += bs;
      ++r.requests;
    }
  }
  r.seconds = now_s() - t0;
  r.cpu_seconds = cpu_s() - cpu0;
  set_percentiles(r, io.take_latencies_ns());
  return r;
}

}  // namespace

IoResult run_io_case(const std::string& path, const IoCase& c) {
  c.aio.validate();
  if (c.size < c.aio.block_size)
    throw config_error("size", "the file size " + format_bytes(static_cast<double>(c.size)) + " is smaller than the block size " +
                                   format_bytes(static_cast<double>(c.aio.block_size)));
  return c.mode == IoMode::randread ? run_randread(path, c) : run_stream(path, c);
}

void prepare_file(const std::string& path, uint64_t size, const AioConfig& aio, uint64_t seed) {
  IoCase c;
  c.mode = IoMode::write;
  c.aio = aio;
  c.size = size;
  c.seed = seed;
  run_io_case(path, c);
}

int64_t verify_file(const std::string& path, uint64_t bytes, const AioConfig& aio, uint64_t seed, uint64_t* checksum) {
  AsyncIo io(aio);
  IoFile f = IoFile::open(path, IoFile::Mode::read, aio.direct);
  const uint64_t chunk = std::min<uint64_t>(stream_chunk_bytes(aio, bytes), 64ull << 20);
  AlignedBuffer got(chunk), want(chunk);
  uint64_t h = kFnv1aBasis;
  int64_t bad = -1;
  for (uint64_t off = 0; off < bytes; off += chunk) {
    uint64_t len = std::min(chunk, bytes - off);
    io.read(f, got.data(), len, off);
    fill_pattern(want.data(), len, off, seed);
    h = fnv1a64(got.data(), len, h);
    if (bad < 0 && std::memcmp(got.data(), want.data(), len) != 0) {
      for (uint64_t i = 0; i < len; ++i)
        if (got.data()[i] != want.data()[i]) {
          bad = static_cast<int64_t>(off + i);
          break;
        }
    }
  }
  if (checksum) *checksum = h;
  return bad;
}

}  // namespace hpct::io
