// Parallel HDF5 file as named float tensors (see h5_file.hpp).
#include "hpct/io/h5_file.hpp"

#include <unistd.h>

#include <fcntl.h>

#include <hdf5.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>

#include "hpct/core/error.hpp"

namespace hpct::io {

namespace {

// The most specific message of HDF5's current error stack ("" if none).
herr_t take_first(unsigned n, const H5E_error2_t* e, void* out) {
  auto* s = static_cast<std::string*>(out);
  if (n == 0 && e && e->desc) *s = std::string(e->func_name ? e->func_name : "") + ": " + e->desc;
  return 0;
}

std::string h5_message() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_first, &s);
  H5Eclear2(H5E_DEFAULT);
  return s;
}

// HDF5 does not pass on the system error of a failed write (ENOSPC, EIO): MPI-IO leaves it in errno.
[[noreturn]] void h5_fail(const std::string& path, const std::string& what, int err = 0) {
  std::string detail = h5_message();
  if (!err) {
    // HDF5 loses errno on the way up; a full filesystem is the common cause, so look.
    std::string dir = path.substr(0, path.find_last_of('/') + 1);
    struct statvfs v {};
    if (::statvfs(dir.empty() ? "." : dir.c_str(), &v) == 0 && v.f_bavail * v.f_frsize < (1u << 20)) err = ENOSPC;
  }
  std::string sys = err ? std::string(": ") + std::strerror(err) : "";
  std::string hint = err == ENOSPC ? "free space on the checkpoint filesystem or lower --keep-last" : "";
  throw file_error(path, what + sys + (detail.empty() ? "" : " (HDF5: " + detail + ")"), hint);
}


struct Quiet {
  Quiet() {
    // A file whose close failed (disk full) stays in HDF5's table; its atexit handler would close
    // it again after MPI_Finalize and crash. The process is ending anyway: no atexit cleanup.
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
};
const Quiet g_quiet;  // HDF5 prints nothing itself; we report

// RAII for hid_t with the right close function.
struct Hid {
  hid_t id = -1;
  herr_t (*closer)(hid_t) = nullptr;
  Hid(hid_t i, herr_t (*c)(hid_t)) : id(i), closer(c) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() {
    if (id >= 0 && closer) closer(id);
  }
  operator hid_t() const { return id; }
};

std::vector<std::string> split_path(const std::string& name) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < name.size()) {
    size_t j = name.find('/', i);
    if (j == std::string::npos) j = name.size();
    if (j > i) parts.push_back(name.substr(i, j - i));
    i = j + 1;
  }
  return parts;
}

void decompose(const std::vector<int64_t>& shape, size_t dim, std::vector<uint64_t> prefix, uint64_t a, uint64_t b,
               std::vector<Box>& out) {
  if (a >= b) return;
  const size_t nd = shape.size();
  uint64_t inner = 1;
  for (size_t d = dim + 1; d < nd; ++d) inner *= static_cast<uint64_t>(shape[d]);
  auto box = [&](uint64_t row0, uint64_t rows) {
    Box bx;
    bx.offset = prefix;
    bx.count.assign(prefix.size(), 1);
    bx.offset.push_back(row0);
    bx.count.push_back(rows);
    for (size_t d = dim + 1; d < nd; ++d) {
      bx.offset.push_back(0);
      bx.count.push_back(static_cast<uint64_t>(shape[d]));
    }
    out.push_back(std::move(bx));
  };
  if (dim + 1 == nd) {
    box(a, b - a);
    return;
  }
  uint64_t ra = a / inner, rb = b / inner;
  auto sub = [&](uint64_t row, uint64_t lo, uint64_t hi) {
    std::vector<uint64_t> p = prefix;
    p.push_back(row);
    decompose(shape, dim + 1, std::move(p), lo, hi, out);
  };
  if (ra == rb) {
    sub(ra, a - ra * inner, b - ra * inner);
    return;
  }
  if (a % inner != 0) {
    sub(ra, a % inner, inner);
    ++ra;
  }
  if (rb > ra) box(ra, rb - ra);
  if (b % inner != 0) sub(rb, 0, b % inner);
}

}  // namespace

std::vector<Box> flat_range_boxes(const std::vector<int64_t>& shape, uint64_t begin, uint64_t end) {
  std::vector<Box> out;
  if (shape.empty()) {
    if (begin < end) out.push_back(Box{{}, {}});
    return out;
  }
  decompose(shape, 0, {}, begin, end, out);
  return out;
}

H5File H5File::open(const std::string& path, Mode mode, MPI_Comm comm) {
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (fapl < 0) h5_fail(path, "H5Pcreate failed");
  if (H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL) < 0) h5_fail(path, "cannot use the MPI-IO driver");
  // Collective metadata: one rank reads/writes it and broadcasts, instead of every rank hitting it.
  H5Pset_all_coll_metadata_ops(fapl, true);
  H5Pset_coll_metadata_write(fapl, true);
  // Large datasets start on 1 MiB boundaries: full-stripe, page-aligned IO on parallel filesystems.
  H5Pset_alignment(fapl, 64 << 10, 1 << 20);
  H5File f;
  f.path_ = path;
  if (mode == Mode::create) {
    // EXCL: never through a name that exists, a planted symbolic link included (the caller
    // removes its own leftovers first).
    f.file_ = H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl);
    if (f.file_ < 0) h5_fail(path, "cannot create the checkpoint file (directory missing or not writable?)");
    f.writable_ = true;
  } else {
    f.file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
    if (f.file_ < 0) h5_fail(path, "cannot open as an HDF5 file (missing, truncated or not a checkpoint)");
  }
  return f;
}

namespace {
constexpr size_t kBounceBytes = 16 << 20;
}

RawFile::~RawFile() {
  if (fd_ >= 0) ::close(fd_);
  if (direct_fd_ >= 0) ::close(direct_fd_);
  std::free(bounce_);
}

void RawFile::open_fds() {
  const bool wr = access_ == Access::write;
  fd_ = ::open(path_.c_str(), (wr ? O_WRONLY | O_NOFOLLOW : O_RDONLY) | O_CLOEXEC);
  if (fd_ < 0)
    throw file_error(path_, std::string(wr ? "cannot open for writing tensor data: " : "cannot open for reading tensor data: ") +
                                std::strerror(errno));
  direct_fd_ = ::open(path_.c_str(), (wr ? O_WRONLY | O_NOFOLLOW : O_RDONLY) | O_CLOEXEC | O_DIRECT);  // -1: buffered only
  if (direct_fd_ >= 0 && ::posix_memalign(reinterpret_cast<void**>(&bounce_), 4096, kBounceBytes) != 0) {
    ::close(direct_fd_);
    direct_fd_ = -1;
  }
}

void RawFile::buffered(char* p, uint64_t off, uint64_t len, const std::string& what) {
  const bool wr = access_ == Access::write;
  while (len > 0) {
    const size_t m = std::min<uint64_t>(len, 1u << 30);
    ssize_t n = wr ? ::pwrite(fd_, p, m, static_cast<off_t>(off)) : ::pread(fd_, p, m, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw file_error(path_, std::string(wr ? "writing " : "reading ") + what + " at byte " + std::to_string(off) + " (" +
                                  std::to_string(len) + " bytes) failed: " +
                                  (n < 0 ? std::strerror(errno) : wr ? std::strerror(EIO) : "end of file (truncated?)"));
    p += n;
    off += static_cast<uint64_t>(n);
    len -= static_cast<uint64_t>(n);
  }
}

void RawFile::transfer(char* p, uint64_t off, uint64_t len, const std::string& what) {
  if (len == 0) return;
  if (fd_ < 0) open_fds();
  const bool wr = access_ == Access::write;
  const uint64_t A = 4096;  // a multiple of every direct-IO alignment met in practice (512, 4096)
  const uint64_t a0 = (off + A - 1) / A * A, a1 = (off + len) / A * A;
  if (direct_fd_ < 0 || a1 <= a0) {
    buffered(p, off, len, what);
    return;
  }
  buffered(p, off, a0 - off, what);
  for (uint64_t o = a0; o < a1; o += kBounceBytes) {
    const uint64_t m = std::min<uint64_t>(kBounceBytes, a1 - o);
    char* q = p + (o - off);
    if (direct_fd_ < 0) {
      buffered(q, o, m, what);
      continue;
    }
    if (!wr) {
      ssize_t r = ::pread(direct_fd_, bounce_, m, static_cast<off_t>(o));
      if (r == static_cast<ssize_t>(m)) std::memcpy(q, bounce_, m);
      else buffered(q, o, m, what);  // short or refused: buffered (names the failure)
      continue;
    }
    std::memcpy(bounce_, q, m);
    ssize_t w = ::pwrite(direct_fd_, bounce_, m, static_cast<off_t>(o));
    if (w < 0 && errno == EINVAL) {  // a device with a coarser direct-IO alignment: go buffered
      ::close(direct_fd_);
      direct_fd_ = -1;
      buffered(q, o, m, what);
    } else if (w != static_cast<ssize_t>(m)) {
      const uint64_t done = w > 0 ? static_cast<uint64_t>(w) : 0;
      if (w < 0 && errno != EINTR)
        throw file_error(path_, "writing " + what + " at byte " + std::to_string(o) + " (" + std::to_string(m) +
                                    " bytes) failed: " + std::strerror(errno));
      buffered(q + done, o + done, m - done, what);  // the rest, buffered
    }
  }
  buffered(p + (a1 - off), a1, off + len - a1, what);
}

void RawFile::write(uint64_t off, const void* data, uint64_t len, const std::string& what) {
  transfer(const_cast<char*>(static_cast<const char*>(data)), off, len, what);  // only read from
}

void RawFile::read(uint64_t off, void* data, uint64_t len, const std::string& what) {
  transfer(static_cast<char*>(data), off, len, what);
}

void RawFile::sync() {
  int rc = 0;
  for (int* fd : {&direct_fd_, &fd_}) {
    if (*fd < 0) continue;
    if (access_ == Access::write && ::fdatasync(*fd) != 0 && rc == 0) rc = errno;
    ::close(*fd);
    *fd = -1;
  }
  std::free(bounce_);
  bounce_ = nullptr;
  if (rc != 0) throw file_error(path_, std::string("flushing the tensor data failed: ") + std::strerror(rc));
}

H5File::H5File(H5File&& o) noexcept
    : path_(std::move(o.path_)), file_(o.file_), raw_(std::move(o.raw_)), writable_(o.writable_) {
  o.file_ = -1;
}

H5File& H5File::operator=(H5File&& o) noexcept {
  if (this != &o) {
    const hid_t f = file_;
    abandon();
    if (f >= 0) H5Fclose(f);
    path_ = std::move(o.path_);
    file_ = o.file_;
    raw_ = std::move(o.raw_);
    writable_ = o.writable_;
    o.file_ = -1;
  }
  return *this;
}

H5File::~H5File() {
  const hid_t f = file_;
  abandon();
  if (f >= 0) H5Fclose(f);
}

void H5File::abandon() {
  raw_.reset();
  file_ = -1;
}

void H5File::close_raw() {
  if (raw_) {
    auto r = std::move(raw_);
    r->sync();
  }
}

void H5File::close() {
  if (file_ < 0) return;
  std::string raw_err;
  try {
    close_raw();
  } catch (const Error& e) {
    raw_err = e.what();
  }
  hid_t f = file_;
  file_ = -1;
  errno = 0;
  if (H5Fflush(f, H5F_SCOPE_LOCAL) < 0) {
    int err = errno;
    std::string msg = h5_message();
    H5Fclose(f);
    H5Eclear2(H5E_DEFAULT);
    throw file_error(path_, "flushing the file failed" + (err ? std::string(": ") + std::strerror(err) : "") +
                                (msg.empty() ? "" : " (HDF5: " + msg + ")"));
  }
  errno = 0;
  if (H5Fclose(f) < 0) h5_fail(path_, "closing the file failed", errno);
  if (!raw_err.empty()) throw Error(raw_err);  // after the collective close: no rank is left waiting
}

void H5File::create_dataset(const std::string& name, const std::vector<int64_t>& shape) {
  auto parts = split_path(name);
  HPCT_REQUIRE(!parts.empty(), "H5File::create_dataset: empty name");
  std::string group;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    group += "/" + parts[i];
    htri_t exists = H5Lexists(file_, group.c_str(), H5P_DEFAULT);
    if (exists < 0) h5_fail(path_, "cannot look up group " + group);
    if (!exists) {
      Hid g(H5Gcreate2(file_, group.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      if (g < 0) h5_fail(path_, "cannot create group " + group);
    }
  }
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Hid space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);  // every element is written; do not write zeros first
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  std::string full = "/" + name.substr(name.find_first_not_of('/'));
  Hid ds(H5Dcreate2(file_, full.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
  if (ds < 0) h5_fail(path_, "cannot create dataset " + full);
}

bool H5File::has_dataset(const std::string& name) const {
  // H5Lexists needs every intermediate link to exist: walk them.
  std::string p;
  for (const auto& part : split_path(name)) {
    p += "/" + part;
    htri_t e = H5Lexists(file_, p.c_str(), H5P_DEFAULT);
    if (e <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
  }
  H5O_info_t info;
  if (H5Oget_info_by_name(file_, p.c_str(), &info, H5P_DEFAULT) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  return info.type == H5O_TYPE_DATASET;
}

std::string H5File::plain_dataset_problem(const std::string& name) const {
  std::string p;
  for (const auto& part : split_path(name)) {
    p += "/" + part;
    htri_t e = H5Lexists(file_, p.c_str(), H5P_DEFAULT);
    if (e <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return "";  // absent: the caller's own check names it
    }
    H5L_info_t li;  // HDF5 1.10's API (Debian 12)
    if (H5Lget_info(file_, p.c_str(), &li, H5P_DEFAULT) < 0) {
      H5Eclear2(H5E_DEFAULT);
      return "its link " + p + " cannot be read";
    }
    if (li.type != H5L_TYPE_HARD)
      return p + " is " + (li.type == H5L_TYPE_SOFT ? "a soft link" : li.type == H5L_TYPE_EXTERNAL ? "an external link to another file" : "a user-defined link") +
             ": a checkpoint holds its tensors itself, in hard-linked datasets";
  }
  H5O_info_t oi;
  if (H5Oget_info_by_name(file_, p.c_str(), &oi, H5P_DEFAULT) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return "";
  }
  if (oi.type != H5O_TYPE_DATASET) return p + " is not a dataset";
  Hid ds(H5Dopen2(file_, p.c_str(), H5P_DEFAULT), H5Dclose);
  if (ds < 0) {
    H5Eclear2(H5E_DEFAULT);
    return p + " cannot be opened";
  }
  Hid dcpl(H5Dget_create_plist(ds), H5Pclose);
  const H5D_layout_t layout = H5Pget_layout(dcpl);
  if (layout == H5D_VIRTUAL) return p + " is a virtual dataset (its data would come from other files)";
  if (layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED && layout != H5D_COMPACT)
    return p + " has a storage layout this reader does not know";
  if (H5Pget_external_count(dcpl) != 0) return p + " has external storage (its bytes would come from another file)";
  Hid type(H5Dget_type(ds), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type);
  const size_t bytes = H5Tget_size(type);
  if (cls != H5T_FLOAT || bytes != 4 || H5Tget_order(type) != H5T_ORDER_LE)
    return p + " holds " + (cls == H5T_FLOAT ? std::to_string(8 * bytes) + "-bit floats" : cls == H5T_INTEGER ? "integers" : "non-numbers") +
           (cls == H5T_FLOAT && bytes == 4 ? " in big-endian order" : "") + ", not the 32-bit little-endian floats of a checkpoint";
  return "";
}

int64_t H5File::open_dataset(const std::string& name) const {
  hid_t ds = H5Dopen2(file_, name.c_str(), H5P_DEFAULT);
  if (ds < 0) h5_fail(path_, "no dataset " + name);
  return ds;
}

std::vector<int64_t> H5File::dataset_shape(const std::string& name) const {
  Hid ds(open_dataset(name), H5Dclose);
  Hid space(H5Dget_space(ds), H5Sclose);
  int nd = H5Sget_simple_extent_ndims(space);
  if (nd < 0) h5_fail(path_, "cannot read the shape of " + name);
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return std::vector<int64_t>(dims.begin(), dims.end());
}

uint64_t H5File::dataset_file_offset(const std::string& name) const {
  const auto a = contiguous_offset(name);
  if (!a) h5_fail(path_, "dataset " + name + " has no contiguous storage");
  return *a;
}

std::optional<uint64_t> H5File::contiguous_offset(const std::string& name) const {
  Hid ds(open_dataset(name), H5Dclose);
  const haddr_t a = H5Dget_offset(ds);
  if (a == HADDR_UNDEF) {
    H5Eclear2(H5E_DEFAULT);
    return std::nullopt;
  }
  return static_cast<uint64_t>(a);
}

namespace {
herr_t collect(hid_t, const char* name, const H5O_info_t* info, void* out) {
  if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(out)->push_back(std::string("/") + name);
  return 0;
}
}  // namespace

std::vector<std::string> H5File::list_datasets() const {
  std::vector<std::string> out;
  if (H5Ovisit(file_, H5_INDEX_NAME, H5_ITER_INC, collect, &out) < 0) h5_fail(path_, "cannot list the datasets");
  std::sort(out.begin(), out.end());
  return out;
}

namespace {
// Selects flat range [start, start+n) of ds in a file dataspace; returns (file space, memory space).
std::pair<hid_t, hid_t> select_range(hid_t ds, uint64_t start, uint64_t n, const std::string& path,
                                     const std::string& name) {
  hid_t fspace = H5Dget_space(ds);
  int nd = H5Sget_simple_extent_ndims(fspace);
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(nd, 0)));
  H5Sget_simple_extent_dims(fspace, dims.data(), nullptr);
  std::vector<int64_t> shape(dims.begin(), dims.end());
  uint64_t total = 1;
  for (auto d : dims) total *= d;
  if (start + n > total) {
    H5Sclose(fspace);
    throw file_error(path, "range [" + std::to_string(start) + ", " + std::to_string(start + n) + ") is outside dataset " +
                               name + " of " + std::to_string(total) + " elements");
  }
  H5Sselect_none(fspace);
  for (const Box& b : flat_range_boxes(shape, start, start + n)) {
    std::vector<hsize_t> off(b.offset.begin(), b.offset.end()), cnt(b.count.begin(), b.count.end());
    if (H5Sselect_hyperslab(fspace, H5S_SELECT_OR, off.data(), nullptr, cnt.data(), nullptr) < 0) {
      H5Sclose(fspace);
      h5_fail(path, "cannot select a range of " + name);
    }
  }
  hsize_t m = n;
  hid_t mspace = H5Screate_simple(1, &m, nullptr);
  return {fspace, mspace};
}
}  // namespace

void H5File::write(const std::string& name, uint64_t start, const float* data, uint64_t n) {
  if (n == 0) return;
  Hid ds(open_dataset(name), H5Dclose);
  if (writable_) {
    Hid space(H5Dget_space(ds), H5Sclose);
    const hssize_t total = H5Sget_simple_extent_npoints(space);
    if (total < 0 || start + n > static_cast<uint64_t>(total))
      throw file_error(path_, "range [" + std::to_string(start) + ", " + std::to_string(start + n) +
                                  ") is outside dataset " + name + " of " + std::to_string(total) + " elements");
    const haddr_t base = H5Dget_offset(ds);
    if (base != HADDR_UNDEF) {
      if (!raw_) raw_ = std::make_unique<RawFile>(path_, RawFile::Access::write);
      raw_->write(static_cast<uint64_t>(base) + start * sizeof(float), data, n * sizeof(float),
                     std::to_string(n) + " elements of " + name);
      return;
    }
  }
  auto [fs, ms] = select_range(ds, start, n, path_, name);
  Hid fspace(fs, H5Sclose), mspace(ms, H5Sclose);
  Hid dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_INDEPENDENT);
  errno = 0;
  if (H5Dwrite(ds, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, data) < 0)
    h5_fail(path_, "writing " + std::to_string(n) + " elements of " + name + " failed", errno);
}

void H5File::read(const std::string& name, uint64_t start, float* data, uint64_t n) const {
  if (n == 0) return;
  Hid ds(open_dataset(name), H5Dclose);
  if (!writable_) {
    // As write(): the aligned body with O_DIRECT (page-cache reads crawl on pinned ranks too), the
    // edges through a buffered descriptor; a range past the end of a truncated file is an error.
    Hid space(H5Dget_space(ds), H5Sclose);
    const hssize_t total = H5Sget_simple_extent_npoints(space);
    const haddr_t base = H5Dget_offset(ds);
    if (total >= 0 && start + n <= static_cast<uint64_t>(total) && base != HADDR_UNDEF) {
      auto* self = const_cast<H5File*>(this);  // the descriptors are a cache of this const read
      if (!self->raw_) self->raw_ = std::make_unique<RawFile>(path_, RawFile::Access::read);
      self->raw_->read(static_cast<uint64_t>(base) + start * sizeof(float), data, n * sizeof(float), name);
      return;
    }
  }
  auto [fs, ms] = select_range(ds, start, n, path_, name);
  Hid fspace(fs, H5Sclose), mspace(ms, H5Sclose);
  Hid dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_INDEPENDENT);
  if (H5Dread(ds, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, data) < 0)
    h5_fail(path_, "reading " + std::to_string(n) + " elements of " + name + " failed (file truncated?)");
}

namespace {
void write_attr(hid_t file, const std::string& path, const std::string& obj, const std::string& key, hid_t type,
                const void* value) {
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  if (H5Aexists_by_name(file, obj.c_str(), key.c_str(), H5P_DEFAULT) > 0) H5Adelete_by_name(file, obj.c_str(), key.c_str(), H5P_DEFAULT);
  Hid a(H5Acreate_by_name(file, obj.c_str(), key.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (a < 0) h5_fail(path, "cannot create attribute " + key + " on " + obj);
  if (H5Awrite(a, type, value) < 0) h5_fail(path, "cannot write attribute " + key + " on " + obj);
}

bool open_attr(hid_t file, const std::string& obj, const std::string& key, hid_t* out) {
  htri_t e = H5Aexists_by_name(file, obj.c_str(), key.c_str(), H5P_DEFAULT);
  if (e <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  *out = H5Aopen_by_name(file, obj.c_str(), key.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  return *out >= 0;
}
}  // namespace

void H5File::set_attr(const std::string& obj, const std::string& key, const std::string& value) {
  Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, std::max<size_t>(value.size(), 1));
  H5Tset_strpad(type, H5T_STR_NULLPAD);
  std::string v = value.empty() ? std::string(1, '\0') : value;
  write_attr(file_, path_, obj, key, type, v.data());
}
void H5File::set_attr(const std::string& obj, const std::string& key, int64_t value) {
  write_attr(file_, path_, obj, key, H5T_NATIVE_INT64, &value);
}
void H5File::set_attr(const std::string& obj, const std::string& key, uint64_t value) {
  write_attr(file_, path_, obj, key, H5T_NATIVE_UINT64, &value);
}
void H5File::set_attr(const std::string& obj, const std::string& key, double value) {
  write_attr(file_, path_, obj, key, H5T_NATIVE_DOUBLE, &value);
}

namespace {
// A hostile file can store any attribute as an array: reading one into a single value would write
// past it. Every attribute we read must hold exactly one element.
void require_one_element(hid_t attr, const std::string& path, const std::string& obj, const std::string& key) {
  Hid space(H5Aget_space(attr), H5Sclose);
  const hssize_t n = space < 0 ? -1 : H5Sget_simple_extent_npoints(space);
  if (n != 1)
    throw file_error(path, "attribute " + key + " of " + obj + " holds " + std::to_string(n) + " elements, one is expected: "
                           "the file is damaged");
}
}  // namespace

std::optional<std::string> H5File::attr_string(const std::string& obj, const std::string& key) const {
  hid_t a;
  if (!open_attr(file_, obj, key, &a)) return std::nullopt;
  Hid attr(a, H5Aclose);
  Hid type(H5Aget_type(attr), H5Tclose);
  if (H5Tget_class(type) != H5T_STRING) return std::nullopt;
  require_one_element(attr, path_, obj, key);
  if (H5Tis_variable_str(type) > 0) {  // as h5py and other tools write strings
    Hid mtype(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mtype, H5T_VARIABLE);
    H5Tset_cset(mtype, H5Tget_cset(type));
    char* p = nullptr;
    if (H5Aread(attr, mtype, &p) < 0) h5_fail(path_, "cannot read attribute " + key + " of " + obj);
    std::string s = p ? p : "";
    if (p) H5free_memory(p);
    return s;
  }
  size_t n = H5Tget_size(type);
  if (n > (64u << 20)) throw file_error(path_, "attribute " + key + " of " + obj + " is " + std::to_string(n) + " bytes long: the file is damaged");
  std::string s(n, '\0');
  Hid mtype(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mtype, n);
  H5Tset_strpad(mtype, H5T_STR_NULLPAD);
  H5Tset_cset(mtype, H5Tget_cset(type));
  if (H5Aread(attr, mtype, s.data()) < 0) h5_fail(path_, "cannot read attribute " + key + " of " + obj);
  s.resize(std::strlen(s.c_str()));
  return s;
}

namespace {
template <class T>
std::optional<T> read_scalar(hid_t file, const std::string& path, const std::string& obj, const std::string& key,
                             hid_t mtype) {
  hid_t a;
  if (!open_attr(file, obj, key, &a)) return std::nullopt;
  Hid attr(a, H5Aclose);
  require_one_element(attr, path, obj, key);
  if constexpr (std::is_integral_v<T>) {  // a float 4.7 is not read as the integer 4
    Hid type(H5Aget_type(attr), H5Tclose);
    if (H5Tget_class(type) != H5T_INTEGER)
      throw file_error(path, "attribute '" + key + "' of " + obj + " is not an integer: the checkpoint is damaged");
  }
  T v{};
  if (H5Aread(attr, mtype, &v) < 0) h5_fail(path, "cannot read attribute " + key + " of " + obj);
  return v;
}
}  // namespace

std::optional<int64_t> H5File::attr_int(const std::string& obj, const std::string& key) const {
  return read_scalar<int64_t>(file_, path_, obj, key, H5T_NATIVE_INT64);
}
std::optional<uint64_t> H5File::attr_uint(const std::string& obj, const std::string& key) const {
  return read_scalar<uint64_t>(file_, path_, obj, key, H5T_NATIVE_UINT64);
}
std::optional<double> H5File::attr_double(const std::string& obj, const std::string& key) const {
  return read_scalar<double>(file_, path_, obj, key, H5T_NATIVE_DOUBLE);
}

}  // namespace hpct::io
