// hpct/io/swap_store.hpp — a rank-local NVMe swap store: K fp32 arrays of n elements each, kept in
// one file under an nvme_path directory and moved through the async IO engine with O_DIRECT. It is
// what ZeRO-Infinity's optimizer and parameter swappers are to DeepSpeed: the optimizer step sweeps
// (master params, exp_avg, exp_avg_sq) tile by tile, reading tile i+1 and writing tile i-1 back while
// tile i is computed; ZeRO-3 reads and writes parameter ranges at any element offset.
//
// Not here: MPI (callers combine errors across ranks), GPU buffers, and what the arrays mean.
// Trade-off: every transfer is a whole number of direct-IO blocks, so each array is padded to the
// block in the file and unaligned ranges go through bounce buffers (read-modify-write at the edges)
// rather than mixing buffered and direct IO on one file.
//
// Threading: like AsyncIo, one owner thread calls everything; the engine's workers run underneath.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hpct/io/aio_config.hpp"
#include "hpct/io/async_io.hpp"

namespace hpct::io {

/// Bit k selects array k (K <= 32).
using ArrayMask = uint32_t;

struct SwapStoreConfig {
  std::string nvme_path;        // directory of the store's file (ds: offload_*.nvme_path)
  std::string tag;              // part of the file name: DIR/hpct_swap.<tag>.bin; include the rank
  int num_arrays = 1;           // K
  uint64_t elems = 0;           // n, elements per array
  size_t chunk_elems = 1 << 20; // sweep tile (ds: sub_group_size); rounded up to whole direct-IO blocks
  int buffer_count = 4;         // sweep slots, each one tile of every array (3+ gives full overlap)
  bool pin_memory = false;      // mlock the host buffers (ds: offload_*.pin_memory)
  bool keep_file = false;       // leave the file in place at destruction
  AioConfig aio;                // ds_config `aio` block; aio.direct false = page cache (only when asked)
  std::string config_key = "nvme_path";  // named in errors, e.g. "offload_optimizer.nvme_path"
};

/// What a sweep's function sees for tile `index`: elements [begin, begin + count) of every array.
struct SweepChunk {
  size_t index = 0;
  uint64_t begin = 0;
  size_t count = 0;
  /// arrays[k]: the tile of array k in a host buffer, or nullptr when k is in neither mask. Arrays in
  /// the read mask hold the file's data; arrays only in the write mask hold garbage to overwrite.
  const std::vector<float*>* arrays = nullptr;
  float* array(int k) const { return (*arrays)[static_cast<size_t>(k)]; }
  // Pipeline bookkeeping at the call (the evidence of overlap the tests check):
  size_t reads_submitted = 0;   // tiles whose read had been handed to the engine
  size_t writes_submitted = 0;  // tiles whose write-back had been handed to the engine
  size_t writes_finished = 0;   // tiles whose write-back the sweep had waited for
};

struct SweepStats {
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;  // payload bytes (block padding excluded)
  size_t chunks = 0;
  double io_wait_seconds = 0;  // time the caller's compute stood still waiting for IO
  double compute_seconds = 0;  // time inside the caller's function
  double wall_seconds = 0;
  /// Achieved bandwidth over the whole sweep, GB/s = 1e9 bytes/s.
  double read_gbps() const { return wall_seconds > 0 ? bytes_read / wall_seconds / 1e9 : 0; }
  double write_gbps() const { return wall_seconds > 0 ? bytes_written / wall_seconds / 1e9 : 0; }
};

class SwapStore;

/// A range read in flight (SwapStore::start_read). Move-only; must not outlive its store. Destroying
/// an unfinished one waits for the IO (dropping its error), so no buffer is freed under the kernel.
class PendingRead {
 public:
  PendingRead() = default;
  PendingRead(PendingRead&& o) noexcept;
  PendingRead& operator=(PendingRead&& o) noexcept;
  PendingRead(const PendingRead&) = delete;
  PendingRead& operator=(const PendingRead&) = delete;
  ~PendingRead();
  bool active() const { return io_ != nullptr; }

 private:
  friend class SwapStore;
  void abandon() noexcept;
  AsyncIo* io_ = nullptr;
  AsyncIo::Ticket ticket_ = 0;
  BufferPool::Lease bounce_;  // empty when reading straight into dst
  size_t skip_ = 0;           // bytes of the bounce buffer before dst's first element
  float* dst_ = nullptr;
  size_t count_ = 0;
  std::string what_;          // "array k, elements [a, b)" for errors
};

class SwapStore {
 public:
  using SweepFn = std::function<void(const SweepChunk&)>;

  /// Validates nvme_path (check_path) and the config, then creates DIR/hpct_swap.<tag>.bin (emptied
  /// if it exists) and preallocates it. Throws hpct::Error before writing anything on bad input.
  explicit SwapStore(const SwapStoreConfig& cfg);
  ~SwapStore();  // waits for IO in flight; removes the file unless keep_file
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  /// Throws a one-line hpct::Error naming `dir` (and `key`) when it does not exist, is not a
  /// directory, is not writable, refuses O_DIRECT (when `direct`; the filesystem is named), or has
  /// fewer than `bytes_needed` bytes free (statvfs; both figures in the message).
  /// `reclaimable` bytes (an old file about to be replaced) count as free.
  static void check_path(const std::string& dir, uint64_t bytes_needed, bool direct = true,
                         const std::string& key = "nvme_path", uint64_t reclaimable = 0);
  /// Bytes of the file for K arrays of n elements with `alignment`-byte blocks.
  static uint64_t file_bytes(int num_arrays, uint64_t elems, size_t alignment = 4096);

  const std::string& path() const { return file_.path(); }
  AioEngine engine() const { return io_->config().engine; }  // the engine in use (`auto` resolved)
  int num_arrays() const { return cfg_.num_arrays; }
  uint64_t elems() const { return cfg_.elems; }
  size_t chunk_elems() const { return chunk_elems_; }  // after rounding
  size_t num_chunks() const;
  size_t alignment() const { return align_; }
  ArrayMask all_arrays() const;
  /// Host memory the store holds now (sweep slots + bounce buffers).
  size_t host_bytes() const;

  /// The pipelined pass: for each tile i in order, fn(tile i) runs on host buffers holding tile i of
  /// the arrays in `read`, while tile i+1.. is being read and tile i-1.. written back; after fn
  /// returns, the arrays in `write` are written back. read = 0 is a write-only pass (initialise),
  /// write = 0 a read-only one. An IO error or an exception from fn stops the sweep after the IO in
  /// flight has drained and is rethrown (IO errors name the file, offset and length); tiles before
  /// it have been written, later ones not.
  SweepStats sweep(ArrayMask read, ArrayMask write, const SweepFn& fn);

  /// Range access at any element offset and length (bounce buffers and read-modify-write at
  /// unaligned edges; straight into dst when dst, offset and length are all block-aligned).
  void read(int k, uint64_t begin, size_t count, float* dst);
  void write(int k, uint64_t begin, const float* src, size_t count);
  /// start_read returns at once; dst must stay alive until finish_read, which waits, copies and
  /// throws the IO's error. finish_read is idempotent (a finished or empty handle returns at once).
  PendingRead start_read(int k, uint64_t begin, size_t count, float* dst);
  void finish_read(PendingRead& r);

  /// Initialises array k from host memory (chunked write of all n elements).
  void load(int k, const float* src) { write(k, 0, src, static_cast<size_t>(cfg_.elems)); }
  /// Copies array k to host memory.
  void store_to(int k, float* dst) { read(k, 0, static_cast<size_t>(cfg_.elems), dst); }
  /// fdatasync of the file (e.g. before a checkpoint names it).
  void sync() const { file_.sync(); }

 private:
  uint64_t array_offset(int k) const { return static_cast<uint64_t>(k) * stride_; }
  void check_range(int k, uint64_t begin, size_t count, const char* what) const;
  std::string range_text(int k, uint64_t begin, size_t count) const;

  SwapStoreConfig cfg_;
  IoFile file_;
  std::unique_ptr<AsyncIo> io_;
  BufferPool pool_;
  size_t align_ = 4096;
  uint64_t stride_ = 0;      // bytes per array in the file (n * 4 rounded up to align_)
  size_t chunk_elems_ = 0;
  std::vector<AlignedBuffer> slots_;  // buffer_count * K tiles, allocated at the first sweep
};

}  // namespace hpct::io
