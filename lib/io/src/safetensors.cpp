// Validating safetensors reader (see safetensors.hpp).
#include "hpct/io/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "hpct/core/error.hpp"
#include "hpct/core/json_config.hpp"
#include "hpct/core/param_layout.hpp"

namespace hpct::io {

namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;  // the format's own reader's limit

uint64_t dtype_bytes(const std::string& dt) {
  static const std::pair<const char*, uint64_t> k[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                                       {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U64", 8},  {"U32", 4},
                                                       {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [n, b] : k)
    if (dt == n) return b;
  return 0;
}

// A JSON integer >= 0 as uint64, or nothing.
bool as_u64(const nlohmann::json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

void pread_all(int fd, void* buf, uint64_t len, uint64_t off, const std::string& path, const std::string& what) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = ::pread(fd, p, std::min<uint64_t>(len, 1u << 30), static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw file_error(path, "cannot read " + what + ": " + std::strerror(errno));
    if (n == 0) throw file_error(path, "is truncated in " + what);
    p += n;
    off += static_cast<uint64_t>(n);
    len -= static_cast<uint64_t>(n);
  }
}

}  // namespace

uint64_t SafetensorsTensor::numel() const {
  uint64_t n = 1;
  for (auto d : shape) n *= static_cast<uint64_t>(d);  // checked not to overflow when parsed
  return n;
}

std::vector<SafetensorsTensor> SafetensorsFile::parse_header(const std::string& text, uint64_t data_bytes,
                                                             const std::string& where) {
  const nlohmann::json h = parse_json(text, where);
  if (!h.is_object()) throw file_error(where, "is not a safetensors file: its header is not a JSON object");
  std::vector<SafetensorsTensor> out;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw file_error(where, "has a '__metadata__' that is not a JSON object");
      continue;
    }
    auto bad = [&](const std::string& what) {
      return file_error(where, "tensor '" + printable(name) + "' " + what, "the file is corrupt or not a safetensors file");
    };
    if (!v.is_object()) throw bad("is not a JSON object with dtype, shape and data_offsets");
    for (auto k = v.begin(); k != v.end(); ++k)
      if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets") throw bad("has an unknown key '" + printable(k.key()) + "'");
    SafetensorsTensor t;
    t.name = name;
    if (!v.contains("dtype") || !v["dtype"].is_string()) throw bad("has no dtype string");
    t.dtype = v["dtype"].get<std::string>();
    const uint64_t esize = dtype_bytes(t.dtype);
    if (esize == 0) throw bad("has an unknown dtype '" + printable(t.dtype) + "'");
    if (!v.contains("shape") || !v["shape"].is_array()) throw bad("has no shape array");
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      uint64_t x = 0;
      if (!as_u64(d, x) || x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw bad("has a shape entry that is not a non-negative integer: " + json_excerpt(d));
      if (x != 0 && numel > std::numeric_limits<uint64_t>::max() / esize / x)
        throw bad("has a shape whose size overflows 64 bits");
      numel *= x;
      t.shape.push_back(static_cast<int64_t>(x));
    }
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2 ||
        !as_u64(v["data_offsets"][0], t.begin) || !as_u64(v["data_offsets"][1], t.end))
      throw bad("needs data_offsets [begin, end] of two non-negative integers");
    if (t.end < t.begin) throw bad("has data_offsets that end before they begin");
    if (t.end - t.begin != numel * esize)
      throw bad("spans " + std::to_string(t.end - t.begin) + " bytes of data, its " + t.dtype + " shape " +
                shape_string(t.shape) + " needs " + std::to_string(numel * esize));
    out.push_back(std::move(t));
  }
  // The tensors must tile the data section: sorted by offset, each starts where the last ended.
  std::vector<const SafetensorsTensor*> by_off;
  for (const auto& t : out) by_off.push_back(&t);
  std::sort(by_off.begin(), by_off.end(), [](auto* a, auto* b) { return a->begin != b->begin ? a->begin < b->begin : a->end < b->end; });
  uint64_t pos = 0;
  for (const auto* t : by_off) {
    if (t->begin != pos)
      throw file_error(where, "tensor '" + printable(t->name) + "' has data_offsets [" + std::to_string(t->begin) + ", " +
                                  std::to_string(t->end) + "]: " + (t->begin < pos ? "they overlap another tensor's" : "they leave a gap before them") +
                                  " (data must follow tensor after tensor)", "the file is corrupt");
    pos = t->end;
  }
  if (pos != data_bytes)
    throw file_error(where, "has " + std::to_string(data_bytes) + " bytes of tensor data, its header accounts for " +
                                std::to_string(pos), pos > data_bytes ? "the file is truncated" : "the file is corrupt");
  return out;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  // O_NONBLOCK: a FIFO or device planted at the path must not block the open; only regular files
  // are read (O_NONBLOCK has no effect on them).
  const int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (raw < 0) throw file_error(path, std::string("cannot open: ") + std::strerror(errno));
  std::shared_ptr<const int> fd(new int(raw), [](const int* p) {
    ::close(*p);
    delete p;
  });
  struct stat st {};
  if (::fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) throw file_error(path, "is not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  unsigned char len8[8];
  if (size < 8) throw file_error(path, "is not a safetensors file (shorter than its 8-byte header length)");
  pread_all(*fd, len8, 8, 0, path, "the header length");
  uint64_t hl = 0;
  for (int i = 7; i >= 0; --i) hl = (hl << 8) | len8[i];  // little-endian on every host
  if (hl < 2 || hl > kMaxHeader || hl > size - 8)
    throw file_error(path, "is not a safetensors file (header length " + std::to_string(hl) + " in a file of " +
                               std::to_string(size) + " bytes)");
  std::string text(hl, '\0');
  pread_all(*fd, text.data(), hl, 8, path, "the header");
  if (text[0] != '{') throw file_error(path, "is not a safetensors file (its header does not start with '{')");
  SafetensorsFile s;
  s.path_ = path;
  s.fd_ = std::move(fd);
  s.data_start_ = 8 + hl;
  s.tensors_ = parse_header(text, size - s.data_start_, path);
  for (size_t i = 0; i < s.tensors_.size(); ++i) s.index_[s.tensors_[i].name] = i;
  return s;
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
// IEEE half -> float, exactly (every half is a float): subnormals, infinities and NaN included.
float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: man * 2^-24, renormalised
    int e = -1;
    uint32_t m = man;
    do {
      ++e;
      m <<= 1;
    } while (!(m & 0x400u));
    bits = sign | (uint32_t(112 - e) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
}  // namespace

std::vector<float> SafetensorsFile::read_f32(const std::string& name, const std::vector<int64_t>& shape) const {
  const SafetensorsTensor* t = find(name);
  if (!t) throw file_error(path_, "has no tensor '" + printable(name) + "'");
  if (t->dtype != "F32" && t->dtype != "F16" && t->dtype != "BF16")
    throw file_error(path_, "tensor '" + printable(name) + "' is " + t->dtype + ": F32, F16 and BF16 are read");
  if (t->shape != shape)
    throw file_error(path_, "tensor '" + printable(name) + "' has shape " + shape_string(t->shape) + ", this model needs " +
                                shape_string(shape));
  std::vector<float> x(t->numel());
  static_assert(sizeof(float) == 4);
  const std::string what = "tensor '" + printable(name) + "'";
  if (t->dtype == "F32") {
    pread_all(*fd_, x.data(), t->end - t->begin, data_start_ + t->begin, path_, what);
    return x;
  }
  std::vector<uint16_t> h(t->numel());  // 16-bit values widened exactly
  pread_all(*fd_, h.data(), t->end - t->begin, data_start_ + t->begin, path_, what);
  if (t->dtype == "BF16") {
    for (size_t i = 0; i < h.size(); ++i) {
      const uint32_t bits = uint32_t(h[i]) << 16;
      std::memcpy(&x[i], &bits, 4);
    }
  } else {
    for (size_t i = 0; i < h.size(); ++i) x[i] = half_to_float(h[i]);
  }
  return x;
}

}  // namespace hpct::io
