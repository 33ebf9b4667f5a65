// hpct/io/async_io.hpp — the async IO engine: submit reads and writes of host buffers at file
// offsets, go on working, wait for them later. It is what DeepSpeed's aio_handle is to ZeRO-Infinity
// and FastPersist: the offload and checkpoint code and the nvme_bench app all go through it.
//
// How a request runs: it is cut into block_size pieces; the pieces are split over thread_count
// worker threads in contiguous runs (intra-op parallelism); each worker keeps up to queue_depth
// pieces in flight on its own kernel queue (an io_uring ring, a libaio context, or, for psync,
// plain pread/pwrite one at a time). With overlap_events a worker refills its queue as pieces
// complete; without, it submits a batch, drains it, and repeats. single_submit makes one submit
// call per piece instead of one per batch.
//
// O_DIRECT by default. The caller's buffer and file offset must then be aligned to the file's
// direct-IO alignment (IoFile::alignment(), usually 512 or 4096; AlignedBuffer gives 4096). The
// length may be anything: the aligned body goes direct, a tail shorter than the alignment goes
// through a second, buffered descriptor of the same file.
//
// Errors (EIO, ENOSPC, a short read past the end of the file) come back from wait() as hpct::Error
// naming the file, offset and length. A short write or read that made progress is resubmitted for
// the rest; one that made none is an error: nothing is retried without bound.
//
// Not here: GPU buffers and GPUDirect Storage (CUDA only; a later step), and file layout (callers
// choose offsets).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hpct/io/aio_config.hpp"

namespace hpct::io {

/// A host buffer aligned to 4096 bytes, optionally mlock()-pinned (DeepSpeed's locked tensors).
/// Move-only; frees (and unlocks) itself.
class AlignedBuffer {
 public:
  static constexpr size_t kAlignment = 4096;
  AlignedBuffer() = default;
  /// Throws hpct::Error when the allocation or the mlock fails (the mlock error names RLIMIT_MEMLOCK).
  explicit AlignedBuffer(size_t bytes, bool pin = false);
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  char* data() { return data_; }
  const char* data() const { return data_; }
  size_t size() const { return size_; }
  bool pinned() const { return pinned_; }

 private:
  void release();
  char* data_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
};

/// Reusable aligned buffers: acquire() hands out a buffer of at least the asked size, and the
/// lease gives it back on destruction, so steady-state offload traffic allocates (and pins) nothing.
class BufferPool {
 public:
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept : pool_(o.pool_), buf_(std::move(o.buf_)) { o.pool_ = nullptr; }
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();
    char* data() { return buf_.data(); }
    size_t size() const { return buf_.size(); }

   private:
    friend class BufferPool;
    Lease(BufferPool* pool, AlignedBuffer buf) : pool_(pool), buf_(std::move(buf)) {}
    BufferPool* pool_ = nullptr;
    AlignedBuffer buf_;
  };

  explicit BufferPool(bool pin = false) : pin_(pin) {}
  /// A buffer of at least `bytes` (rounded up to 4096), reused when one is free.
  Lease acquire(size_t bytes);
  size_t allocated_bytes() const;  // everything the pool owns, leased or free
  size_t free_buffers() const;

 private:
  void give_back(AlignedBuffer buf);
  bool pin_;
  mutable std::mutex mu_;
  std::multimap<size_t, AlignedBuffer> free_;
  size_t allocated_ = 0;
};

/// A file opened for the engine: a direct descriptor for aligned IO and a buffered one for tails.
class IoFile {
 public:
  enum class Mode { read, write, read_write };
  /// write and read_write create the file if missing; `truncate` empties it. Errors name the path;
  /// a filesystem that refuses O_DIRECT gets an error saying so (with the hint to ask for buffered IO).
  static IoFile open(const std::string& path, Mode mode, bool direct = true, bool truncate = false);
  IoFile() = default;
  IoFile(IoFile&& o) noexcept;
  IoFile& operator=(IoFile&& o) noexcept;
  IoFile(const IoFile&) = delete;
  IoFile& operator=(const IoFile&) = delete;
  ~IoFile();

  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  /// Required alignment of buffer address, offset and length for the direct descriptor (1 if buffered).
  size_t alignment() const { return alignment_; }
  int direct_fd() const { return fd_; }
  int buffered_fd() const { return bfd_; }
  uint64_t size() const;  // current file size (fstat)
  /// fdatasync: written data is on stable storage when it returns. Errors name the file.
  void sync() const;
  /// Preallocates [0, bytes) (fallocate), so ENOSPC shows up now rather than mid-run.
  void allocate(uint64_t bytes) const;
  void close();

 private:
  std::string path_;
  int fd_ = -1, bfd_ = -1;
  bool direct_ = false;
  size_t alignment_ = 1;
};

namespace detail {
struct Request;
class Worker;
}  // namespace detail

/// The engine. Submit from one thread (the owner); workers run in the background.
class AsyncIo {
 public:
  using Ticket = uint64_t;

  /// Starts thread_count workers with their kernel queues (asynchronous signals blocked in them, so
  /// the application's threads handle Ctrl-C and SIGTERM). Throws when a named engine is
  /// unavailable; `auto` takes the first available (resolve_engine) and says on stderr what it
  /// passed over and why: once per process for the kernel's refusal, each time for a refused queue.
  explicit AsyncIo(const AioConfig& cfg);
  ~AsyncIo();  // waits for every outstanding request (errors are dropped: call wait_all() to see them)
  AsyncIo(const AsyncIo&) = delete;
  AsyncIo& operator=(const AsyncIo&) = delete;

  const AioConfig& config() const { return cfg_; }  // with the engine resolved (never `automatic`)

  /// Starts reading len bytes at file offset `off` into buf. buf and off must be aligned to
  /// file.alignment(); the file and buffer must stay alive until wait() returns.
  Ticket submit_read(const IoFile& file, void* buf, size_t len, uint64_t off);
  Ticket submit_write(const IoFile& file, const void* buf, size_t len, uint64_t off);
  /// Blocks until the request is done; throws its error. Idempotent: a ticket already waited for
  /// (or unknown) returns at once.
  void wait(Ticket t);
  /// True when the request is done (then wait() does not block).
  bool test(Ticket t);
  /// Waits for everything submitted; throws the first error after all have finished.
  void wait_all();
  size_t outstanding() const;

  /// Blocking conveniences: submit + wait.
  void read(const IoFile& file, void* buf, size_t len, uint64_t off) { wait(submit_read(file, buf, len, off)); }
  void write(const IoFile& file, const void* buf, size_t len, uint64_t off) { wait(submit_write(file, buf, len, off)); }

  /// Per-piece latency (submission to the kernel -> completion), recorded while enabled.
  void record_latencies(bool on);
  /// Returns and clears the recorded latencies, in nanoseconds.
  std::vector<uint64_t> take_latencies_ns();

 private:
  Ticket submit(const IoFile& file, char* buf, size_t len, uint64_t off, bool write);
  AioConfig cfg_;
  std::vector<std::unique_ptr<detail::Worker>> workers_;
  mutable std::mutex mu_;
  std::map<Ticket, std::shared_ptr<detail::Request>> requests_;
  Ticket next_ = 1;
  size_t rr_ = 0;  // round-robin start for requests smaller than thread_count pieces
  std::atomic<bool> recording_{false};
};

}  // namespace hpct::io
