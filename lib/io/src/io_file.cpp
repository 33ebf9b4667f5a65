// The async IO engine's buffers and files (async_io.hpp): aligned, optionally pinned buffers, the
// pool that reuses them, and IoFile, the O_DIRECT file the engine reads and writes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "hpct/core/error.hpp"
#include "hpct/core/units.hpp"
#include "hpct/io/async_io.hpp"

namespace hpct::io {

// ---------------------------------------------------------------------------------------------
// Buffers

AlignedBuffer::AlignedBuffer(size_t bytes, bool pin) {
  size_t n = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (n == 0) n = kAlignment;
  void* p = nullptr;
  if (posix_memalign(&p, kAlignment, n) != 0)
    throw Error("cannot allocate an aligned IO buffer of " + format_bytes(static_cast<double>(n)));
  data_ = static_cast<char*>(p);
  size_ = n;
  if (pin) {
    if (mlock(data_, size_) != 0) {
      int err = errno;
      std::free(data_);
      data_ = nullptr;
      size_ = 0;
      throw Error("mlock of a " + format_bytes(static_cast<double>(n)) + " IO buffer failed: " + std::strerror(err),
                  Error::Context{"", "aio.pin_buffers",
                                 "raise the locked-memory limit (ulimit -l, or Slurm's PropagateResourceLimits) or do not pin"});
    }
    pinned_ = true;
  }
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), size_(o.size_), pinned_(o.pinned_) {
  o.data_ = nullptr;
  o.size_ = 0;
  o.pinned_ = false;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    size_ = o.size_;
    pinned_ = o.pinned_;
    o.data_ = nullptr;
    o.size_ = 0;
    o.pinned_ = false;
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { release(); }

void AlignedBuffer::release() {
  if (!data_) return;
  if (pinned_) munlock(data_, size_);
  std::free(data_);
  data_ = nullptr;
  size_ = 0;
  pinned_ = false;
}

BufferPool::Lease& BufferPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    if (pool_) pool_->give_back(std::move(buf_));
    pool_ = o.pool_;
    buf_ = std::move(o.buf_);
    o.pool_ = nullptr;
  }
  return *this;
}

BufferPool::Lease::~Lease() {
  if (pool_) pool_->give_back(std::move(buf_));
}

BufferPool::Lease BufferPool::acquire(size_t bytes) {
  size_t n = (bytes + AlignedBuffer::kAlignment - 1) / AlignedBuffer::kAlignment * AlignedBuffer::kAlignment;
  {
    std::lock_guard lk(mu_);
    auto it = free_.lower_bound(n);
    // Reuse a free buffer unless it is wastefully large (more than twice the ask).
    if (it != free_.end() && it->first <= 2 * std::max<size_t>(n, AlignedBuffer::kAlignment)) {
      AlignedBuffer b = std::move(it->second);
      free_.erase(it);
      return Lease(this, std::move(b));
    }
  }
  AlignedBuffer b(n, pin_);
  std::lock_guard lk(mu_);
  allocated_ += b.size();
  return Lease(this, std::move(b));
}

void BufferPool::give_back(AlignedBuffer buf) {
  if (!buf.data()) return;
  std::lock_guard lk(mu_);
  size_t n = buf.size();
  free_.emplace(n, std::move(buf));
}

size_t BufferPool::allocated_bytes() const {
  std::lock_guard lk(mu_);
  return allocated_;
}

size_t BufferPool::free_buffers() const {
  std::lock_guard lk(mu_);
  return free_.size();
}

// ---------------------------------------------------------------------------------------------
// Files

namespace {
size_t direct_alignment(int fd) {
#ifdef STATX_DIOALIGN
  struct statx sx {};
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
      sx.stx_dio_offset_align > 0) {
    return std::max<size_t>({sx.stx_dio_offset_align, sx.stx_dio_mem_align, 512});
  }
#else
  (void)fd;
#endif
  return 4096;  // safe for every common device when the kernel does not say
}
}  // namespace

IoFile IoFile::open(const std::string& path, Mode mode, bool direct, bool truncate) {
  int acc = mode == Mode::read ? O_RDONLY : mode == Mode::write ? O_WRONLY : O_RDWR;
  // Scratch files live at predictable names in shared directories: nothing is written through a
  // symbolic link (O_NOFOLLOW), and a file to be emptied is replaced by a new one made here
  // (O_EXCL), so a link or a file planted at that name never gets another file truncated.
  int flags = acc | O_CLOEXEC | (mode == Mode::read ? 0 : O_CREAT | O_NOFOLLOW);
  if (truncate && mode != Mode::read) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
      if (S_ISLNK(st.st_mode))
        throw file_error(path, "is a symbolic link: refusing to write through it", "remove it, or choose another directory");
      if (!S_ISREG(st.st_mode)) throw file_error(path, "exists and is not a regular file", "remove it, or choose another directory");
      if (::unlink(path.c_str()) != 0)
        throw file_error(path, std::string("exists and cannot be replaced: ") + std::strerror(errno),
                         "remove it (another user's file?), or choose another directory");
    }
    flags |= O_EXCL;
  }
  IoFile f;
  f.path_ = path;
  f.direct_ = direct;
  f.fd_ = ::open(path.c_str(), flags | (direct ? O_DIRECT : 0), 0644);
  if (f.fd_ < 0) {
    int err = errno;
    if (direct && err == EINVAL) {
      throw file_error(path, "the filesystem does not support O_DIRECT",
                       "ask for buffered IO explicitly (nvme_bench --buffered, aio.direct false)");
    }
    std::string hint;
    if (err == ENOENT) hint = mode == Mode::read ? "check the path" : "create the directory first";
    if (err == EACCES || err == EROFS) hint = "choose a writable directory";
    if (err == ELOOP) throw file_error(path, "is a symbolic link: refusing to write through it", "remove it, or choose another directory");
    if (err == EEXIST) throw file_error(path, "was created by someone else while this one was being made", "choose another directory");
    throw file_error(path, std::string("cannot open: ") + std::strerror(err), hint);
  }
  // The same file again, not whatever the name points to by now.
  f.bfd_ = ::open(("/proc/self/fd/" + std::to_string(f.fd_)).c_str(), acc | O_CLOEXEC);
  if (f.bfd_ < 0) f.bfd_ = ::open(path.c_str(), acc | O_CLOEXEC | (mode == Mode::read ? 0 : O_NOFOLLOW));
  if (f.bfd_ < 0) {
    int err = errno;
    throw file_error(path, std::string("cannot open a second (buffered) descriptor: ") + std::strerror(err));
  }
  f.alignment_ = direct ? direct_alignment(f.fd_) : 1;
  return f;
}

IoFile::IoFile(IoFile&& o) noexcept
    : path_(std::move(o.path_)), fd_(o.fd_), bfd_(o.bfd_), direct_(o.direct_), alignment_(o.alignment_) {
  o.fd_ = o.bfd_ = -1;
}

IoFile& IoFile::operator=(IoFile&& o) noexcept {
  if (this != &o) {
    close();
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    bfd_ = o.bfd_;
    direct_ = o.direct_;
    alignment_ = o.alignment_;
    o.fd_ = o.bfd_ = -1;
  }
  return *this;
}

IoFile::~IoFile() { close(); }

void IoFile::close() {
  if (fd_ >= 0) ::close(fd_);
  if (bfd_ >= 0) ::close(bfd_);
  fd_ = bfd_ = -1;
}

uint64_t IoFile::size() const {
  struct stat st {};
  if (fstat(fd_, &st) != 0) throw file_error(path_, std::string("fstat: ") + std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

void IoFile::sync() const {
  if (fdatasync(fd_) != 0) throw file_error(path_, std::string("fdatasync: ") + std::strerror(errno));
}

void IoFile::allocate(uint64_t bytes) const {
  int rc = posix_fallocate(fd_, 0, static_cast<off_t>(bytes));
  if (rc == 0 || rc == EOPNOTSUPP || rc == EINVAL) return;  // not every filesystem preallocates; IO will tell
  throw file_error(path_, "cannot reserve " + format_bytes(static_cast<double>(bytes)) + ": " + std::strerror(rc),
                   rc == ENOSPC ? "free space on the device or ask for a smaller size" : "");
}

}  // namespace hpct::io
