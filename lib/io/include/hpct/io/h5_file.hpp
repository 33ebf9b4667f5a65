// hpct/io/h5_file.hpp — a parallel HDF5 file (MPI-IO driver) seen as named float tensors with
// attributes: what the checkpointer needs and no more.
//
// Every logical tensor is one dataset with its full, unsharded shape; a rank writes or reads any
// flat (row-major) element range of it, which becomes a union of hyperslabs — so a ZeRO shard
// that starts mid-row, a tensor-parallel slice or a whole replica are all the same call. Datasets
// are created collectively; data moves with independent MPI-IO (each rank's range is large and
// contiguous in the file, and independent IO lets ranks with nothing to write skip the call).
//
// Not here: chunking, compression, variable-length types; the file layout policy (checkpointer).
// HDF5's own error printing is switched off: failures come back as hpct::Error naming the file
// and the object, with HDF5's innermost message.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <memory>
#include <string>
#include <vector>

namespace hpct::io {

/// Reads or writes byte ranges of one existing file, the way checkpoint tensors move: the
/// direct-IO-aligned body with O_DIRECT through a 16 MiB aligned bounce buffer, the unaligned edges
/// through a buffered descriptor (they may share a block with a neighbour's range or HDF5 metadata,
/// which the page cache merges); buffered throughout where O_DIRECT is refused. No HDF5 and no MPI:
/// an asynchronous save runs it on a thread of its own.
class RawFile {
 public:
  enum class Access { read, write };
  RawFile(std::string path, Access access) : path_(std::move(path)), access_(access) {}
  ~RawFile();  // closes without syncing
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;
  /// Throw hpct::Error naming the file, `what`, the offset and the errno text (a read past the end
  /// says the file may be truncated).
  void write(uint64_t offset, const void* data, uint64_t len, const std::string& what);
  void read(uint64_t offset, void* data, uint64_t len, const std::string& what);
  /// Writes: fdatasync, then close; throws naming the file. Reads: close. Idempotent.
  void sync();

 private:
  void open_fds();
  void transfer(char* p, uint64_t off, uint64_t len, const std::string& what);
  void buffered(char* p, uint64_t off, uint64_t len, const std::string& what);
  std::string path_;
  Access access_;
  int fd_ = -1, direct_fd_ = -1;
  char* bounce_ = nullptr;
};

/// A box of a row-major array: offset and count per dimension.
struct Box {
  std::vector<uint64_t> offset, count;
};
/// The boxes that cover flat elements [begin, end) of an array of `shape`, in order (at most
/// 2 * ndim - 1 of them). Exposed for tests.
std::vector<Box> flat_range_boxes(const std::vector<int64_t>& shape, uint64_t begin, uint64_t end);

class H5File {
 public:
  enum class Mode { create, read };
  /// Collective over comm. create truncates; read opens read-only and fails with a clear message
  /// for a missing, truncated or non-HDF5 file.
  static H5File open(const std::string& path, Mode mode, MPI_Comm comm);
  H5File() = default;
  H5File(H5File&& o) noexcept;
  H5File& operator=(H5File&& o) noexcept;
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;
  ~H5File();  // closes (collective: every rank must destroy its H5File together)

  /// Collective. Flushes and closes; errors (e.g. ENOSPC while flushing metadata) throw.
  void close();
  const std::string& path() const { return path_; }
  /// Local: forgets the file without flushing or closing it, for a file that is being deleted
  /// after a failure (closing would try to write and, with the disk full, could leave ranks
  /// waiting on each other). The MPI-IO handle is released at MPI_Finalize.
  void abandon();

  /// Collective: creates a float32 dataset `name` ("/model/layers/3/attn/qkv/weight"; groups are
  /// created as needed) of the given shape, allocated now.
  void create_dataset(const std::string& name, const std::vector<int64_t>& shape);
  bool has_dataset(const std::string& name) const;
  /// Why the dataset `name` is not plain data of this file, or "" if it is: every component of its
  /// path a hard link (no soft or external link), its storage in this file (contiguous, chunked or
  /// compact; no virtual dataset, no external storage), its elements 32-bit little-endian IEEE
  /// floats (what read() and write() move; an f16 or f64 dataset was read as wrong floats or as
  /// "truncated"). Only links are looked at before the dataset
  /// is opened, so a rank calls it in the same order as the others (opening a virtual dataset is
  /// collective in a parallel file): readers check every tensor this way before any per-rank read.
  std::string plain_dataset_problem(const std::string& name) const;
  /// Shape of an existing dataset; throws naming it if absent.
  std::vector<int64_t> dataset_shape(const std::string& name) const;
  /// Byte offset of a dataset's data in the file (contiguous layout): for inspection tools and tests.
  uint64_t dataset_file_offset(const std::string& name) const;
  /// The same, or nothing for a dataset without one contiguous extent (chunked, compact, unwritten).
  std::optional<uint64_t> contiguous_offset(const std::string& name) const;
  /// Every dataset in the file, full paths, sorted.
  std::vector<std::string> list_datasets() const;

  /// Independent: flat elements [start, start + n) of the dataset, row-major. Writes to a file
  /// being created go straight to the dataset's bytes (a flat range of a contiguous dataset is one
  /// byte range): the direct-IO-aligned body with O_DIRECT through an aligned bounce buffer, the
  /// unaligned edges buffered. Buffered writes from ranks pinned to cores (srun/mpirun binding)
  /// crawl here (0.6 GB/s against 3.3 unpinned, the kernel's copy and writeback share the pinned
  /// core); O_DIRECT does not (2.2 GB/s pinned). close() fdatasyncs them on every rank before the
  /// collective close.
  void write(const std::string& name, uint64_t start, const float* data, uint64_t n);
  void read(const std::string& name, uint64_t start, float* data, uint64_t n) const;

  /// Attributes on an object ("/" for the file, or a dataset path). Setting is collective (every
  /// rank passes the same value); getting is local.
  void set_attr(const std::string& obj, const std::string& key, const std::string& value);
  void set_attr(const std::string& obj, const std::string& key, int64_t value);
  void set_attr(const std::string& obj, const std::string& key, uint64_t value);
  void set_attr(const std::string& obj, const std::string& key, double value);
  std::optional<std::string> attr_string(const std::string& obj, const std::string& key) const;
  std::optional<int64_t> attr_int(const std::string& obj, const std::string& key) const;
  std::optional<uint64_t> attr_uint(const std::string& obj, const std::string& key) const;
  std::optional<double> attr_double(const std::string& obj, const std::string& key) const;

 private:
  int64_t open_dataset(const std::string& name) const;  // hid_t; caller closes
  std::string path_;
  int64_t file_ = -1;  // hid_t
  std::unique_ptr<RawFile> raw_;  // this rank's tensor bytes: written (file being created) or read
  bool writable_ = false;
  void close_raw();  // syncs and closes raw_ (fdatasync for writes); throws naming the file
};

}  // namespace hpct::io
