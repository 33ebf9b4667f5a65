// Megatron's MMIDIDX reader and writer (see indexed_dataset.hpp for the layout and trade-offs).
//
// Not here: any caching of derived indices; a dataset is validated in full on every open, which
// is one pass over the index (milliseconds for millions of items) and catches a truncated copy
// before a job spends an hour reaching the bad sample.
#include "hpct/io/indexed_dataset.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "hpct/core/error.hpp"

namespace hpct::io {

// The format is little-endian and we read it with memcpy: a big-endian host would need swaps.
static_assert(std::endian::native == std::endian::little, "MMIDIDX reader assumes a little-endian host");

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr char kLegacyMagic[8] = {'T', 'N', 'T', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
// magic(9) + version(8) + dtype(1) + N(8) + D(8): where the sizes array starts.
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

bool valid_dtype_code(uint8_t c) { return c >= 1 && c <= 8; }

// A read-only mapping of a whole file, unmapped when it goes out of scope.
class MappedFile {
 public:
  MappedFile(const std::string& path, const char* role) {
    // O_NONBLOCK: a FIFO at the path is refused below, not waited on.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      if (errno == ENOENT)
        throw file_error(path, std::string("dataset ") + role + " file not found",
                         "--data-path takes the prefix without .bin/.idx; build one with preprocess_data");
      HPCT_CHECK_SYS(fd, "open " + path);
    }
    struct stat st {};
    int rc = ::fstat(fd, &st);
    if (rc < 0) {
      int err = errno;
      ::close(fd);
      throw_syscall_error("fstat", "fstat " + path, err, __FILE__, __LINE__);
    }
    if (!S_ISREG(st.st_mode)) {  // a directory's st_size is not a length (it read as 2^63-1 bytes)
      ::close(fd);
      throw file_error(path, std::string("dataset ") + role + " file is " +
                                 (S_ISDIR(st.st_mode) ? "a directory" : "not a regular file (a device, FIFO or socket)"),
                       "--data-path takes the prefix of a .bin/.idx pair made by preprocess_data");
    }
    len_ = static_cast<size_t>(st.st_size);
    if (len_ > 0) {
      void* p = ::mmap(nullptr, len_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        int err = errno;
        ::close(fd);
        throw_syscall_error("mmap", "mmap " + path, err, __FILE__, __LINE__);
      }
      addr_ = static_cast<const unsigned char*>(p);
    }
    ::close(fd);  // the mapping keeps the file alive
  }
  ~MappedFile() {
    if (addr_) ::munmap(const_cast<unsigned char*>(addr_), len_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  /// Hands the mapping to the caller, who must munmap it.
  const unsigned char* release() { return std::exchange(addr_, nullptr); }
  const unsigned char* data() const { return addr_; }
  size_t size() const { return len_; }

 private:
  const unsigned char* addr_ = nullptr;
  size_t len_ = 0;
};

// Widens n stored values to int32; false when one does not fit (int64 and float files only).
template <typename T>
bool convert(const unsigned char* src, size_t n, int32_t* out) {
  for (size_t i = 0; i < n; ++i) {
    T v = load<T>(src + i * sizeof(T));
    if constexpr (std::is_floating_point_v<T>) {
      const double x = static_cast<double>(v);
      if (!(x >= -2147483648.0 && x < 2147483648.0)) return false;
    } else if constexpr (sizeof(T) > 4) {
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) return false;
    }
    out[i] = static_cast<int32_t>(v);
  }
  return true;
}

template <typename T>
bool fits(std::span<const int32_t> tokens, size_t* bad) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    int64_t v = tokens[i];
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) || v > static_cast<int64_t>(std::numeric_limits<T>::max())) {
      *bad = i;
      return false;
    }
  }
  return true;
}

template <typename T>
void narrow(std::span<const int32_t> tokens, unsigned char* dst) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    T v = static_cast<T>(tokens[i]);
    std::memcpy(dst + i * sizeof(T), &v, sizeof(T));
  }
}

}  // namespace

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::uint8:
    case DType::int8:
      return 1;
    case DType::int16:
    case DType::uint16:
      return 2;
    case DType::int32:
    case DType::float32:
      return 4;
    case DType::int64:
    case DType::float64:
      return 8;
  }
  throw Error("dtype_size: invalid dtype code " + std::to_string(static_cast<int>(dt)));
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::uint8: return "uint8";
    case DType::int8: return "int8";
    case DType::int16: return "int16";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::float64: return "float64";
    case DType::float32: return "float32";
    case DType::uint16: return "uint16";
  }
  return "invalid";
}

DType best_fitting_dtype(size_t vocab_size) { return vocab_size < 65500 ? DType::uint16 : DType::int32; }

std::string index_file_path(const std::string& prefix) { return prefix + ".idx"; }
std::string data_file_path(const std::string& prefix) { return prefix + ".bin"; }

// ---------------------------------------------------------------------------------------------
// Builder

IndexedDatasetBuilder::IndexedDatasetBuilder(std::string prefix, DType dtype) : prefix_(std::move(prefix)), dtype_(dtype) {
  if (dtype == DType::float32 || dtype == DType::float64 || !valid_dtype_code(static_cast<uint8_t>(dtype)))
    throw file_error(data_file_path(prefix_), std::string("cannot write token ids as ") + dtype_name(dtype),
                     "use an integer dtype (uint16 or int32, see best_fitting_dtype)");
  // The pid keeps two writers of the same prefix from sharing a temporary.
  const std::string tag = ".tmp-" + std::to_string(::getpid());
  tmp_bin_ = data_file_path(prefix_) + tag;
  tmp_idx_ = index_file_path(prefix_) + tag;
  bin_ = std::fopen(tmp_bin_.c_str(), "wb");
  if (!bin_) throw_syscall_error("fopen", "create " + tmp_bin_, errno, __FILE__, __LINE__);
  std::setvbuf(bin_, nullptr, _IOFBF, 1 << 20);
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (bin_) std::fclose(bin_);
  if (!finalized_) {
    std::remove(tmp_bin_.c_str());
    std::remove(tmp_idx_.c_str());
  }
}

void IndexedDatasetBuilder::write_bin(const void* data, size_t bytes) {
  if (bytes > 0 && std::fwrite(data, 1, bytes, bin_) != bytes)
    throw_syscall_error("fwrite", "write " + tmp_bin_, errno, __FILE__, __LINE__);
}

void IndexedDatasetBuilder::add_item(std::span<const int32_t> tokens) {
  if (finalized_) throw Error("IndexedDatasetBuilder::add_item after finalize (" + prefix_ + ")");
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw file_error(data_file_path(prefix_), "item of " + std::to_string(tokens.size()) +
                                                  " tokens exceeds the int32 size field of the index");
  size_t bad = 0;
  bool ok = true;
  switch (dtype_) {
    case DType::uint8: ok = fits<uint8_t>(tokens, &bad); break;
    case DType::int8: ok = fits<int8_t>(tokens, &bad); break;
    case DType::int16: ok = fits<int16_t>(tokens, &bad); break;
    case DType::uint16: ok = fits<uint16_t>(tokens, &bad); break;
    default: break;  // int32 and int64 hold every int32
  }
  if (!ok)
    throw file_error(data_file_path(prefix_),
                     "token " + std::to_string(tokens[bad]) + " of item " + std::to_string(sizes_.size()) +
                         " does not fit the dataset dtype " + dtype_name(dtype_),
                     "choose the dtype with best_fitting_dtype(vocab_size)");
  const size_t isz = dtype_size(dtype_);
  if (dtype_ == DType::int32) {
    write_bin(tokens.data(), tokens.size_bytes());
  } else {
    scratch_.resize(tokens.size() * isz);
    switch (dtype_) {
      case DType::uint8: narrow<uint8_t>(tokens, scratch_.data()); break;
      case DType::int8: narrow<int8_t>(tokens, scratch_.data()); break;
      case DType::int16: narrow<int16_t>(tokens, scratch_.data()); break;
      case DType::uint16: narrow<uint16_t>(tokens, scratch_.data()); break;
      case DType::int64: narrow<int64_t>(tokens, scratch_.data()); break;
      default: break;
    }
    write_bin(scratch_.data(), scratch_.size());
  }
  sizes_.push_back(static_cast<int32_t>(tokens.size()));
  num_tokens_ += tokens.size();
}

void IndexedDatasetBuilder::end_document() {
  if (finalized_) throw Error("IndexedDatasetBuilder::end_document after finalize (" + prefix_ + ")");
  doc_idx_.push_back(static_cast<int64_t>(sizes_.size()));
}

void IndexedDatasetBuilder::finalize() {
  if (finalized_) return;
  // fsync before rename: otherwise a power cut can persist the rename but not the bytes.
  if (std::fflush(bin_) != 0) throw_syscall_error("fflush", "write " + tmp_bin_, errno, __FILE__, __LINE__);
  HPCT_CHECK_SYS(::fsync(::fileno(bin_)), "fsync " + tmp_bin_);
  std::fclose(bin_);
  bin_ = nullptr;

  const uint64_t n = sizes_.size(), d = doc_idx_.size();
  std::vector<int64_t> pointers(n);
  int64_t off = 0;
  const int64_t isz = static_cast<int64_t>(dtype_size(dtype_));
  for (size_t i = 0; i < n; ++i) {
    pointers[i] = off;
    off += static_cast<int64_t>(sizes_[i]) * isz;
  }
  std::vector<unsigned char> idx(kHeaderBytes + n * 4 + n * 8 + d * 8);
  unsigned char* p = idx.data();
  auto put = [&p](const void* src, size_t bytes) {
    if (bytes > 0) std::memcpy(p, src, bytes);  // an empty vector's data() may be null
    p += bytes;
  };
  const uint8_t code = static_cast<uint8_t>(dtype_);
  put(kMagic, sizeof kMagic);
  put(&kVersion, 8);
  put(&code, 1);
  put(&n, 8);
  put(&d, 8);
  put(sizes_.data(), n * 4);
  put(pointers.data(), n * 8);
  put(doc_idx_.data(), d * 8);

  std::FILE* f = std::fopen(tmp_idx_.c_str(), "wb");
  if (!f) throw_syscall_error("fopen", "create " + tmp_idx_, errno, __FILE__, __LINE__);
  bool ok = std::fwrite(idx.data(), 1, idx.size(), f) == idx.size() && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  int err = errno;
  std::fclose(f);
  if (!ok) throw_syscall_error("fwrite", "write " + tmp_idx_, err, __FILE__, __LINE__);
  // .bin first: a crash between the renames leaves no new .idx, and an old .idx next to the new
  // .bin fails open()'s size check instead of reading wrong tokens.
  HPCT_CHECK_SYS(std::rename(tmp_bin_.c_str(), data_file_path(prefix_).c_str()), "rename " + tmp_bin_);
  HPCT_CHECK_SYS(std::rename(tmp_idx_.c_str(), index_file_path(prefix_).c_str()), "rename " + tmp_idx_);
  finalized_ = true;
}

// ---------------------------------------------------------------------------------------------
// Reader

IndexedDataset IndexedDataset::open(const std::string& prefix) {
  const std::string idx_path = index_file_path(prefix), bin_path = data_file_path(prefix);
  IndexedDataset ds;
  ds.prefix_ = prefix;
  {
    MappedFile idx(idx_path, "index");
    const unsigned char* b = idx.data();
    const size_t len = idx.size();
    if (len >= sizeof kLegacyMagic && std::memcmp(b, kLegacyMagic, sizeof kLegacyMagic) == 0)
      throw file_error(idx_path, "legacy Megatron index (TNTIDX) is not supported, expected MMIDIDX",
                       "re-run preprocess_data with --dataset-impl mmap");
    if (len < sizeof kMagic || std::memcmp(b, kMagic, sizeof kMagic) != 0)
      throw file_error(idx_path, "bad magic: not a Megatron MMIDIDX index");
    if (len < kHeaderBytes)
      throw file_error(idx_path, "index too short for its header: " + std::to_string(len) + " bytes, expected at least " +
                                     std::to_string(kHeaderBytes));
    const uint64_t version = load<uint64_t>(b + 9);
    if (version != kVersion)
      throw file_error(idx_path, "unsupported index version " + std::to_string(version) + ", expected 1");
    const uint8_t code = b[17];
    if (!valid_dtype_code(code))
      throw file_error(idx_path, "unknown dtype code " + std::to_string(code) + ", expected 1..8");
    ds.dtype_ = static_cast<DType>(code);
    const uint64_t n = load<uint64_t>(b + 18), d = load<uint64_t>(b + 26);
    // 128-bit so that an absurd N or D from a corrupt header cannot wrap around.
    const unsigned __int128 need = static_cast<unsigned __int128>(kHeaderBytes) +
                                   static_cast<unsigned __int128>(n) * 12 + static_cast<unsigned __int128>(d) * 8;
    if (need != len) {
      const std::string counts = "N=" + std::to_string(n) + " items and D=" + std::to_string(d) + " document indices";
      if (need > len)
        throw file_error(idx_path, "index too short for " + counts + ": " + std::to_string(len) + " bytes, expected " +
                                       (need >> 64 ? std::string("more than 2^64") : std::to_string(static_cast<uint64_t>(need))));
      throw file_error(idx_path, "index has " + std::to_string(len - static_cast<uint64_t>(need)) +
                                     " trailing bytes after " + counts);
    }
    ds.sizes_.resize(n);
    ds.pointers_.resize(n);
    ds.doc_idx_.resize(d);
    if (n > 0) {
      std::memcpy(ds.sizes_.data(), b + kHeaderBytes, n * 4);
      std::memcpy(ds.pointers_.data(), b + kHeaderBytes + n * 4, n * 8);
    }
    if (d > 0) std::memcpy(ds.doc_idx_.data(), b + kHeaderBytes + n * 12, d * 8);
  }
  const int64_t isz = static_cast<int64_t>(dtype_size(ds.dtype_));
  int64_t expect = 0;
  for (size_t i = 0; i < ds.sizes_.size(); ++i) {
    if (ds.sizes_[i] < 0)
      throw file_error(idx_path, "item " + std::to_string(i) + " has negative size " + std::to_string(ds.sizes_[i]));
    if (ds.pointers_[i] != expect)
      throw file_error(idx_path, "pointer of item " + std::to_string(i) + " is " + std::to_string(ds.pointers_[i]) +
                                     ", expected " + std::to_string(expect) +
                                     " (the running sum of sizes times the itemsize)");
    expect += static_cast<int64_t>(ds.sizes_[i]) * isz;
    ds.num_tokens_ += static_cast<uint64_t>(ds.sizes_[i]);
  }
  const auto& di = ds.doc_idx_;
  const int64_t n = static_cast<int64_t>(ds.sizes_.size());
  if (di.empty() || di.front() != 0)
    throw file_error(idx_path, "doc_idx must start with 0");
  for (size_t i = 1; i < di.size(); ++i)
    if (di[i] < di[i - 1])
      throw file_error(idx_path, "doc_idx is not monotone: entry " + std::to_string(i) + " is " + std::to_string(di[i]) +
                                     " after " + std::to_string(di[i - 1]));
  if (di.back() != n)
    throw file_error(idx_path, "doc_idx ends at " + std::to_string(di.back()) + ", expected N=" + std::to_string(n));

  MappedFile bin(bin_path, "data");
  if (bin.size() != static_cast<uint64_t>(expect))
    throw file_error(bin_path, "data file has " + std::to_string(bin.size()) + " bytes, expected " +
                                   std::to_string(expect) + " (sum of sizes times " + std::to_string(isz) +
                                   "-byte " + dtype_name(ds.dtype_) + ")",
                     "the .bin and .idx come from different runs, or a copy was truncated");
  ds.bin_bytes_ = bin.size();
  ds.bin_ = bin.release();
  return ds;
}

IndexedDataset::IndexedDataset(IndexedDataset&& o) noexcept
    : prefix_(std::move(o.prefix_)),
      dtype_(o.dtype_),
      sizes_(std::move(o.sizes_)),
      pointers_(std::move(o.pointers_)),
      doc_idx_(std::move(o.doc_idx_)),
      num_tokens_(o.num_tokens_),
      bin_(std::exchange(o.bin_, nullptr)),
      bin_bytes_(std::exchange(o.bin_bytes_, 0)) {
  o.sizes_.clear();
  o.pointers_.clear();
  o.doc_idx_.assign(1, 0);
  o.num_tokens_ = 0;
}

IndexedDataset& IndexedDataset::operator=(IndexedDataset&& o) noexcept {
  if (this != &o) {
    release();
    prefix_ = std::move(o.prefix_);
    dtype_ = o.dtype_;
    sizes_ = std::move(o.sizes_);
    pointers_ = std::move(o.pointers_);
    doc_idx_ = std::move(o.doc_idx_);
    num_tokens_ = std::exchange(o.num_tokens_, 0);
    bin_ = std::exchange(o.bin_, nullptr);
    bin_bytes_ = std::exchange(o.bin_bytes_, 0);
    o.sizes_.clear();
    o.pointers_.clear();
    o.doc_idx_.assign(1, 0);
  }
  return *this;
}

IndexedDataset::~IndexedDataset() { release(); }

void IndexedDataset::release() noexcept {
  if (bin_) ::munmap(const_cast<unsigned char*>(bin_), bin_bytes_);
  bin_ = nullptr;
  bin_bytes_ = 0;
}

void IndexedDataset::read(size_t item, size_t offset, size_t length, int32_t* out) const {
  if (item >= sizes_.size())
    throw file_error(data_file_path(prefix_), "item " + std::to_string(item) + " out of range (dataset has " +
                                                  std::to_string(sizes_.size()) + " items)");
  const size_t size = static_cast<size_t>(sizes_[item]);
  if (offset > size || length > size - offset)
    throw file_error(data_file_path(prefix_), "read of tokens [" + std::to_string(offset) + ", " +
                                                  std::to_string(offset + length) + ") outside item " +
                                                  std::to_string(item) + " of " + std::to_string(size) + " tokens");
  if (length == 0) return;
  const size_t isz = dtype_size(dtype_);
  const unsigned char* src = bin_ + static_cast<size_t>(pointers_[item]) + offset * isz;
  bool ok = true;
  switch (dtype_) {
    case DType::uint8: ok = convert<uint8_t>(src, length, out); break;
    case DType::int8: ok = convert<int8_t>(src, length, out); break;
    case DType::int16: ok = convert<int16_t>(src, length, out); break;
    case DType::uint16: ok = convert<uint16_t>(src, length, out); break;
    case DType::int32: std::memcpy(out, src, length * sizeof(int32_t)); break;
    case DType::int64: ok = convert<int64_t>(src, length, out); break;
    case DType::float32: ok = convert<float>(src, length, out); break;
    case DType::float64: ok = convert<double>(src, length, out); break;
  }
  if (!ok)
    throw file_error(data_file_path(prefix_), "a token of item " + std::to_string(item) + " does not fit int32");
}

}  // namespace hpct::io
