// The NVMe swap store (see swap_store.hpp): path checks, file layout, the sweep pipeline and
// range access through bounce buffers.
#include "hpct/io/swap_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "hpct/core/error.hpp"
#include "hpct/core/units.hpp"

namespace hpct::io {

namespace {

constexpr size_t kElem = sizeof(float);

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
uint64_t align_down(uint64_t x, uint64_t a) { return x / a * a; }

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string bytes_text(uint64_t b) {
  return format_bytes(static_cast<double>(b)) + " (" + std::to_string(b) + " bytes)";
}

// The filesystem's name from statfs's magic number, for the O_DIRECT message.
std::string filesystem_name(const std::string& dir) {
  struct statfs sf {};
  if (::statfs(dir.c_str(), &sf) != 0) return "";
  struct Known {
    unsigned long magic;
    const char* name;
  };
  static const Known kKnown[] = {
      {0xEF53, "ext4"},       {0x58465342, "xfs"},     {0x01021994, "tmpfs"},   {0x858458f6, "ramfs"},
      {0x9123683E, "btrfs"},  {0x6969, "nfs"},         {0x794c7630, "overlayfs"}, {0x2fc12fc1, "zfs"},
      {0x65735546, "fuse"},   {0x0BD00BD0, "lustre"},  {0x47504653, "gpfs"},    {0x19830326, "beegfs"},
      {0xFF534D42, "cifs"},   {0x73717368, "squashfs"}, {0x9fa0, "proc"},        {0x62656572, "sysfs"},
  };
  auto magic = static_cast<unsigned long>(sf.f_type) & 0xFFFFFFFFul;
  for (const auto& k : kKnown)
    if (k.magic == magic) return k.name;
  char buf[32];
  std::snprintf(buf, sizeof buf, "type 0x%lx", magic);
  return buf;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// PendingRead

PendingRead::PendingRead(PendingRead&& o) noexcept
    : io_(o.io_), ticket_(o.ticket_), bounce_(std::move(o.bounce_)), skip_(o.skip_), dst_(o.dst_), count_(o.count_),
      what_(std::move(o.what_)) {
  o.io_ = nullptr;
}

PendingRead& PendingRead::operator=(PendingRead&& o) noexcept {
  if (this != &o) {
    abandon();
    io_ = o.io_;
    ticket_ = o.ticket_;
    bounce_ = std::move(o.bounce_);
    skip_ = o.skip_;
    dst_ = o.dst_;
    count_ = o.count_;
    what_ = std::move(o.what_);
    o.io_ = nullptr;
  }
  return *this;
}

PendingRead::~PendingRead() { abandon(); }

void PendingRead::abandon() noexcept {
  if (!io_) return;
  try {
    io_->wait(ticket_);
  } catch (...) {  // nobody asked for the data: the error goes with it
  }
  io_ = nullptr;
  bounce_ = BufferPool::Lease();
}

// ---------------------------------------------------------------------------------------------
// Construction and checks

uint64_t SwapStore::file_bytes(int num_arrays, uint64_t elems, size_t alignment) {
  return static_cast<uint64_t>(std::max(num_arrays, 0)) * align_up(elems * kElem, std::max<size_t>(alignment, 1));
}

void SwapStore::check_path(const std::string& dir, uint64_t bytes_needed, bool direct, const std::string& key,
                           uint64_t reclaimable) {
  auto fail = [&](const std::string& msg, const std::string& hint) {
    return Error(dir + ": " + msg, Error::Context{"", key, hint});
  };
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT) throw fail("does not exist", "create it (mkdir -p) or point " + key + " at a directory on local NVMe");
    throw fail(std::string("cannot stat: ") + std::strerror(err), "point " + key + " at a directory on local NVMe");
  }
  if (!S_ISDIR(st.st_mode)) throw fail("is not a directory", "point " + key + " at a directory, not a file");
  if (::access(dir.c_str(), W_OK) != 0) {
    int err = errno;
    throw fail(std::string("is not writable (") + std::strerror(err) + ")",
               "choose a directory this user can write, on a read-write mount");
  }

  bool probe_out_of_space = false;
  if (direct) {
    // Some filesystems refuse O_DIRECT at open (tmpfs before Linux 6.6, ramfs), others only at the
    // first IO (some FUSE), so the probe opens and writes one block.
    std::string probe = dir + "/.hpct_swap_probe." + std::to_string(::getpid());
    ::unlink(probe.c_str());  // a leftover, or a link planted at this name: never written through
    int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_NOFOLLOW | O_WRONLY | O_DIRECT | O_CLOEXEC, 0600);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0) {
      AlignedBuffer block(AlignedBuffer::kAlignment);
      std::memset(block.data(), 0, block.size());
      ssize_t rc;
      do {
        rc = ::pwrite(fd, block.data(), block.size(), 0);
      } while (rc < 0 && errno == EINTR);
      err = rc < 0 ? errno : 0;
      ::close(fd);
    }
    ::unlink(probe.c_str());  // an open refused for O_DIRECT may still have created it
    if (err == EINVAL) {
      std::string fs = filesystem_name(dir);
      throw fail("the filesystem" + (fs.empty() ? std::string() : " (" + fs + ")") + " refuses O_DIRECT",
                 "point " + key + " at a local NVMe filesystem (ext4, xfs), or set aio.direct false to go through the "
                 "page cache");
    }
    if (err == ENOSPC || err == EDQUOT) {
      probe_out_of_space = true;  // reported with the figures below
    } else if (err == EACCES || err == EROFS || err == EPERM) {
      throw fail(std::string("is not writable (") + std::strerror(err) + ")",
                 "choose a directory this user can write, on a read-write mount");
    } else if (err != 0) {
      throw fail(std::string("a probe write with O_DIRECT failed: ") + std::strerror(err), "");
    }
  }

  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) throw fail(std::string("statvfs: ") + std::strerror(errno), "");
  uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * static_cast<uint64_t>(vfs.f_frsize) + reclaimable;
  if (avail < bytes_needed || probe_out_of_space) {
    throw fail("the swap file needs " + bytes_text(bytes_needed) + " but only " + bytes_text(avail) + " are free",
               "free space there, point " + key + " at a larger device, or offload fewer elements per rank");
  }
}

SwapStore::SwapStore(const SwapStoreConfig& cfg) : cfg_(cfg), pool_(cfg.pin_memory || cfg.aio.pin_buffers) {
  if (cfg_.nvme_path.empty()) throw config_error(cfg_.config_key, "no directory given", "set it to a directory on local NVMe");
  if (cfg_.tag.empty() || cfg_.tag.find('/') != std::string::npos)
    throw config_error("tag", "swap store tag '" + cfg_.tag + "' must be non-empty and contain no '/'");
  if (cfg_.num_arrays < 1 || cfg_.num_arrays > 32)
    throw config_error("num_arrays", std::to_string(cfg_.num_arrays) + " arrays; a swap store holds 1 to 32");
  if (cfg_.buffer_count < 1)
    throw config_error("buffer_count", std::to_string(cfg_.buffer_count) + " is below 1", "3 or more overlaps read, compute and write");
  if (cfg_.chunk_elems < 1) throw config_error("chunk_elems", "must be at least 1");
  cfg_.aio.validate("aio");
  io_ = std::make_unique<AsyncIo>(cfg_.aio);  // before the file: an unavailable engine leaves nothing behind

  std::string dir = cfg_.nvme_path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string path = dir + "/hpct_swap." + cfg_.tag + ".bin";
  uint64_t reclaimable = 0;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) reclaimable = static_cast<uint64_t>(st.st_blocks) * 512;
  check_path(dir, file_bytes(cfg_.num_arrays, cfg_.elems, AlignedBuffer::kAlignment), cfg_.aio.direct, cfg_.config_key,
             reclaimable);

  file_ = IoFile::open(path, IoFile::Mode::read_write, cfg_.aio.direct, /*truncate=*/true);
  try {
    if (file_.alignment() > AlignedBuffer::kAlignment)
      throw file_error(path, "direct-IO alignment of " + std::to_string(file_.alignment()) +
                                 " bytes exceeds the 4096 of the IO buffers",
                       "set aio.direct false for this device");
    align_ = AlignedBuffer::kAlignment;  // whole pages: every device's logical block divides it
    stride_ = align_up(cfg_.elems * kElem, align_);
    file_.allocate(stride_ * static_cast<uint64_t>(cfg_.num_arrays));
  } catch (...) {
    file_.close();
    ::unlink(path.c_str());
    throw;
  }
  const size_t unit = align_ / kElem;
  chunk_elems_ = static_cast<size_t>(align_up(cfg_.chunk_elems, unit));
  chunk_elems_ = std::min<size_t>(chunk_elems_, std::max<size_t>(unit, static_cast<size_t>(align_up(cfg_.elems, unit))));
}

SwapStore::~SwapStore() {
  io_.reset();  // waits for every request before the buffers go
  std::string path = file_.path();
  file_.close();
  if (!cfg_.keep_file && !path.empty()) ::unlink(path.c_str());
}

size_t SwapStore::num_chunks() const {
  return static_cast<size_t>((cfg_.elems + chunk_elems_ - 1) / chunk_elems_);
}

ArrayMask SwapStore::all_arrays() const {
  return cfg_.num_arrays >= 32 ? ~ArrayMask{0} : (ArrayMask{1} << cfg_.num_arrays) - 1;
}

size_t SwapStore::host_bytes() const {
  size_t b = pool_.allocated_bytes();
  for (const auto& s : slots_) b += s.size();
  return b;
}

std::string SwapStore::range_text(int k, uint64_t begin, size_t count) const {
  return "swap store '" + cfg_.tag + "', array " + std::to_string(k) + ", elements [" + std::to_string(begin) + ", " +
         std::to_string(begin + count) + ")";
}

void SwapStore::check_range(int k, uint64_t begin, size_t count, const char* what) const {
  if (k < 0 || k >= cfg_.num_arrays)
    throw Error(std::string("SwapStore::") + what + ": array " + std::to_string(k) + " of a store with " +
                std::to_string(cfg_.num_arrays) + " arrays");
  if (begin > cfg_.elems || count > cfg_.elems - begin)
    throw Error(std::string("SwapStore::") + what + ": elements [" + std::to_string(begin) + ", " +
                std::to_string(begin + count) + ") are outside the " + std::to_string(cfg_.elems) + " of each array");
}

// ---------------------------------------------------------------------------------------------
// The sweep

SweepStats SwapStore::sweep(ArrayMask rmask, ArrayMask wmask, const SweepFn& fn) {
  if ((rmask | wmask) & ~all_arrays())
    throw Error("SwapStore::sweep: array mask names arrays beyond the " + std::to_string(cfg_.num_arrays) + " of '" +
                cfg_.tag + "'");
  SweepStats stats;
  const size_t nchunks = num_chunks();
  if (nchunks == 0) return stats;
  const size_t K = static_cast<size_t>(cfg_.num_arrays);
  const size_t B = static_cast<size_t>(cfg_.buffer_count);
  const size_t chunk_bytes = chunk_elems_ * kElem;
  if (slots_.empty()) {
    slots_.reserve(B * K);
    for (size_t i = 0; i < B * K; ++i) slots_.emplace_back(chunk_bytes, cfg_.pin_memory || cfg_.aio.pin_buffers);
  }
  // Tiles read ahead of the one computed. A slot is busy from its read until its write-back is done,
  // so with write-back, B slots give B-2 tiles of read-ahead (one slot computes, one writes); with
  // two slots the read-ahead wins and the write of i-1 is waited for before fn(i). A write-only pass
  // needs no read-ahead: it only waits for a slot's old write when the slot comes round again.
  size_t ahead = 0;
  if (rmask) ahead = wmask ? (B >= 3 ? B - 2 : B - 1) : B - 1;

  auto buf = [&](size_t slot, size_t k) { return reinterpret_cast<float*>(slots_[slot * K + k].data()); };
  auto count_of = [&](size_t c) { return static_cast<size_t>(std::min<uint64_t>(chunk_elems_, cfg_.elems - c * chunk_elems_)); };
  auto off_of = [&](size_t c, size_t k) { return array_offset(static_cast<int>(k)) + c * chunk_bytes; };

  struct Pending {
    AsyncIo::Ticket t;
    size_t chunk, k;
    bool write;
  };
  std::vector<std::vector<Pending>> reads(B), writes(B);  // per slot
  size_t next_read = 0, writes_submitted = 0, writes_finished = 0, reads_submitted = 0;

  auto wait_one = [&](const Pending& p) {
    double t0 = now_s();
    try {
      io_->wait(p.t);
    } catch (const Error& e) {
      throw Error(e.message() + " [" + (p.write ? "writing back " : "reading ") +
                  range_text(static_cast<int>(p.k), p.chunk * chunk_elems_, count_of(p.chunk)) + ", tile " +
                  std::to_string(p.chunk) + "]");
    }
    stats.io_wait_seconds += now_s() - t0;
  };
  auto finish_writes = [&](size_t slot) {
    if (writes[slot].empty()) return;
    for (const auto& p : writes[slot]) wait_one(p);
    writes[slot].clear();
    ++writes_finished;
  };
  // Waits for everything of this sweep still in flight, dropping errors (the first one is on its way).
  auto drain = [&]() noexcept {
    for (auto* group : {&reads, &writes})
      for (auto& v : *group)
        for (const auto& p : v) {
          try {
            io_->wait(p.t);
          } catch (...) {
          }
        }
  };

  std::vector<float*> ptrs(K, nullptr);
  const double t_start = now_s();
  try {
    for (size_t i = 0; i < nchunks; ++i) {
      // Hand the engine every read up to `ahead` tiles past this one (and this one's own slot).
      while (next_read < nchunks && next_read <= i + ahead) {
        size_t j = next_read++, s = j % B;
        finish_writes(s);  // the slot's previous tile (j - B) must be on disk before it is reused
        size_t len = static_cast<size_t>(align_up(count_of(j) * kElem, align_));
        for (size_t k = 0; k < K; ++k) {
          if (!(rmask >> k & 1)) continue;
          reads[s].push_back({io_->submit_read(file_, buf(s, k), len, off_of(j, k)), j, k, false});
          stats.bytes_read += count_of(j) * kElem;
        }
        if (rmask) ++reads_submitted;
      }
      size_t s = i % B;
      for (const auto& p : reads[s]) wait_one(p);
      reads[s].clear();

      for (size_t k = 0; k < K; ++k) ptrs[k] = ((rmask | wmask) >> k & 1) ? buf(s, k) : nullptr;
      SweepChunk c;
      c.index = i;
      c.begin = i * chunk_elems_;
      c.count = count_of(i);
      c.arrays = &ptrs;
      c.reads_submitted = reads_submitted;
      c.writes_submitted = writes_submitted;
      c.writes_finished = writes_finished;
      double t0 = now_s();
      fn(c);
      stats.compute_seconds += now_s() - t0;

      if (wmask) {
        // The block padding past the last element goes out too (the file has room for it): whole
        // blocks keep every transfer on the direct path.
        size_t len = static_cast<size_t>(align_up(c.count * kElem, align_));
        for (size_t k = 0; k < K; ++k) {
          if (!(wmask >> k & 1)) continue;
          writes[s].push_back({io_->submit_write(file_, buf(s, k), len, off_of(i, k)), i, k, true});
          stats.bytes_written += c.count * kElem;
        }
        ++writes_submitted;
      }
      ++stats.chunks;
    }
    for (size_t i = nchunks > B ? nchunks - B : 0; i < nchunks; ++i) finish_writes(i % B);
  } catch (...) {
    drain();
    throw;
  }
  stats.wall_seconds = now_s() - t_start;
  return stats;
}

// ---------------------------------------------------------------------------------------------
// Range access

PendingRead SwapStore::start_read(int k, uint64_t begin, size_t count, float* dst) {
  check_range(k, begin, count, "read");
  PendingRead r;
  if (count == 0) return r;
  const uint64_t bb = begin * kElem, be = (begin + count) * kElem;
  const uint64_t ab = align_down(bb, align_), ae = align_up(be, align_);
  r.dst_ = dst;
  r.count_ = count;
  r.what_ = range_text(k, begin, count);
  try {
    if (bb == ab && be == ae && reinterpret_cast<uintptr_t>(dst) % align_ == 0) {
      r.ticket_ = io_->submit_read(file_, dst, static_cast<size_t>(be - bb), array_offset(k) + bb);
    } else {
      r.bounce_ = pool_.acquire(static_cast<size_t>(ae - ab));
      r.skip_ = static_cast<size_t>(bb - ab);
      r.ticket_ = io_->submit_read(file_, r.bounce_.data(), static_cast<size_t>(ae - ab), array_offset(k) + ab);
    }
  } catch (const Error& e) {
    throw Error(e.message() + " [reading " + r.what_ + "]");
  }
  r.io_ = io_.get();
  return r;
}

void SwapStore::finish_read(PendingRead& r) {
  if (!r.io_) return;
  AsyncIo* io = r.io_;
  r.io_ = nullptr;  // finished from here on, whatever happens
  try {
    io->wait(r.ticket_);
  } catch (const Error& e) {
    r.bounce_ = BufferPool::Lease();
    throw Error(e.message() + " [reading " + r.what_ + "]");
  }
  if (r.bounce_.data()) {
    std::memcpy(r.dst_, r.bounce_.data() + r.skip_, r.count_ * kElem);
    r.bounce_ = BufferPool::Lease();
  }
}

void SwapStore::read(int k, uint64_t begin, size_t count, float* dst) {
  PendingRead r = start_read(k, begin, count, dst);
  finish_read(r);
}

void SwapStore::write(int k, uint64_t begin, const float* src, size_t count) {
  check_range(k, begin, count, "write");
  if (count == 0) return;
  const uint64_t base = array_offset(k);
  const uint64_t bb = begin * kElem, be = (begin + count) * kElem;
  const std::string what = range_text(k, begin, count);
  auto rethrow = [&](const Error& e) { return Error(e.message() + " [writing " + what + "]"); };

  if (bb % align_ == 0 && be % align_ == 0 && reinterpret_cast<uintptr_t>(src) % align_ == 0) {
    try {
      io_->write(file_, src, static_cast<size_t>(be - bb), base + bb);
    } catch (const Error& e) {
      throw rethrow(e);
    }
    return;
  }
  // Through two bounce buffers of up to one tile each: piece j+1 is filled (and its edge blocks read
  // back) while piece j is being written. Pieces after the first start on a block boundary, so only
  // the first piece's head and the last piece's tail are read-modify-write.
  const uint64_t cap = static_cast<uint64_t>(chunk_elems_) * kElem;
  BufferPool::Lease bounce[2];
  AsyncIo::Ticket ticket[2] = {0, 0};
  try {
    size_t idx = 0;
    for (uint64_t p = bb; p < be; ++idx) {
      const uint64_t pa = align_down(p, align_);
      const uint64_t pe = std::min(be, pa + cap);
      const uint64_t pae = align_up(pe, align_);
      const size_t b = idx % 2;
      if (ticket[b]) {
        io_->wait(ticket[b]);
        ticket[b] = 0;
      }
      if (!bounce[b].data()) bounce[b] = pool_.acquire(static_cast<size_t>(std::min(cap, align_up(be, align_) - align_down(bb, align_))));
      char* d = bounce[b].data();
      if (p != pa) io_->read(file_, d, align_, base + pa);  // head block: keep the bytes before p
      if (pe != pae && !(p != pa && pae - align_ == pa))   // tail block, unless the head read covered it
        io_->read(file_, d + (pae - align_ - pa), align_, base + pae - align_);
      std::memcpy(d + (p - pa), reinterpret_cast<const char*>(src) + (p - bb), static_cast<size_t>(pe - p));
      ticket[b] = io_->submit_write(file_, d, static_cast<size_t>(pae - pa), base + pa);
      p = pe;
    }
    for (auto& t : ticket)
      if (t) {
        io_->wait(t);
        t = 0;
      }
  } catch (...) {
    for (auto t : ticket) {  // no bounce buffer goes back to the pool under the kernel
      try {
        if (t) io_->wait(t);
      } catch (...) {
      }
    }
    try {
      throw;
    } catch (const Error& e) {
      throw rethrow(e);
    }
  }
}

}  // namespace hpct::io
