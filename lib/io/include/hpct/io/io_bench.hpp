// hpct/io/io_bench.hpp — one storage measurement on one process: stream a file through the async
// IO engine (sequential write or read, or random reads) and report bytes, time, CPU time and
// per-request latency percentiles. nvme_bench runs it on every rank and aggregates; the offload
// code can run it at start-up to check a path before trusting it with optimizer state.
//
// How the stream is driven: one block-sized request per buffer of a ring, as fio drives its
// iodepth buffers: queue_depth x threads in flight plus one queued per thread, so no worker's
// queue drains while the caller refills a finished buffer (stream_ring). Random reads submit one
// block per request with queue_depth x threads requests outstanding.
//
// Not here: MPI (the app aggregates), choosing what to measure (the app's grid), fio itself.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hpct/io/aio_config.hpp"

namespace hpct::io {

enum class IoMode { write, read, randread };
const char* mode_name(IoMode m);
IoMode parse_mode(const std::string& text, const std::string& key);

struct IoCase {
  IoMode mode = IoMode::write;
  AioConfig aio;
  uint64_t size = 1ull << 30;  // bytes of the file (written, read, or the range random reads fall in)
  double runtime = 0;          // stop issuing new IO after this many seconds (0: no limit)
  bool record_latency = false; // per-request latency percentiles (always on for randread)
  bool fsync = true;           // writes: fdatasync before the clock stops (fio's end_fsync=1)
  uint64_t seed = 1;           // data pattern and random offsets
};

struct IoResult {
  uint64_t bytes = 0;     // transferred
  uint64_t requests = 0;  // block-sized requests completed (IOPS = requests / seconds)
  double seconds = 0;     // wall time of the timed part
  double cpu_seconds = 0; // user + system CPU of the process over the timed part (all threads)
  double lat_p50_us = -1, lat_p99_us = -1, lat_p999_us = -1, lat_max_us = -1;  // -1: not measured
  double mb_per_s() const { return seconds > 0 ? bytes / seconds / 1e6 : 0; }
  double iops() const { return seconds > 0 ? requests / seconds : 0; }
};

/// The data a write case puts at file offset `off`: pseudo-random bytes from the seed that repeat
/// every kPatternPeriod bytes, with the first 8 bytes of every 4 KiB block replaced by a stamp of
/// its file offset, so a block written to the wrong place is caught. A read-back is checked without
/// keeping the file in memory. `off` must be a multiple of 4096; `len` may end mid-block.
inline constexpr uint64_t kPatternPeriod = 1 << 20;
void fill_pattern(char* dst, size_t len, uint64_t off, uint64_t seed);
/// Rewrites only the offset stamps of a buffer already holding the pattern for another offset
/// (cheap: one word per 4 KiB), which is how the timed stream refills its buffers.
void stamp_pattern(char* dst, size_t len, uint64_t off, uint64_t seed);
/// Bytes per request of an untimed whole-file pass (verification): at least block x depth x
/// threads and 16 MiB, a multiple of the pattern period.
uint64_t stream_chunk_bytes(const AioConfig& aio, uint64_t size);
/// The timed stream's ring of block-sized buffers: (queue_depth + 1) x threads of them, no more
/// than the file has requests. `restamp`: a buffer keeps its data and only its stamps are
/// rewritten per write, because the slot count is rounded up to a multiple of the pattern's phases
/// for this block size. For odd block sizes, where that multiple would more than double the ring
/// (and pass 64 MiB), each write regenerates its data instead.
struct StreamRing {
  size_t slots = 1;
  bool restamp = true;
};
StreamRing stream_ring(const AioConfig& aio, uint64_t size);

/// Runs one case on `path`. Writes preallocate the file first (as fio does); reads need the file to
/// exist with at least `size` bytes (prepare_file). Throws hpct::Error naming the file on IO errors.
IoResult run_io_case(const std::string& path, const IoCase& c);

/// Writes the pattern over [0, size) (untimed), so read cases have a file to read.
void prepare_file(const std::string& path, uint64_t size, const AioConfig& aio, uint64_t seed);

/// Reads [0, bytes) back and compares it with the pattern; returns the first mismatching offset
/// or -1 when everything matches. Also returns the checksum (FNV-1a 64 over the bytes) in *checksum.
int64_t verify_file(const std::string& path, uint64_t bytes, const AioConfig& aio, uint64_t seed,
                    uint64_t* checksum = nullptr);
/// Percentile q (0..1) of a sample by nearest rank; -1 for an empty sample. Reorders v.
double percentile(std::vector<uint64_t>& v, double q);

/// Drops the file's pages from the page cache (buffered mode), so a read measures the device.
void drop_file_cache(const std::string& path);

}  // namespace hpct::io
