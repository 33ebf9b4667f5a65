// hpct/io/safetensors.hpp — a reader of Hugging Face safetensors files that trusts nothing in them.
//
// Layout: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {...}}, then the data; offsets count from the end
// of the header. Files come from the internet, so the header is checked whole before any tensor is
// read, with the rules of the format's own reader: every entry an object with a known dtype, a shape
// of non-negative integers whose element count does not overflow, exactly two offsets with
// begin <= end, end - begin == elements x dtype size, and the tensors, sorted by offset, tiling the
// data section exactly (no overlap, no gap, nothing past the end). Each failure is one hpct::Error
// naming the file and the tensor.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hpct::io {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
  uint64_t numel() const;
};

class SafetensorsFile {
 public:
  /// Opens and validates `path` (header against the file's size). Throws hpct::Error.
  static SafetensorsFile open(const std::string& path);
  /// Validates a header's JSON text against a data section of `data_bytes`; `where` names the
  /// source in errors. What open() runs; exposed for tests and the fuzz target.
  static std::vector<SafetensorsTensor> parse_header(const std::string& json_text, uint64_t data_bytes,
                                                     const std::string& where);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const;
  /// The tensor's values as fp32 (F16 and BF16 widened exactly); it must be F32, F16 or BF16 and of
  /// exactly `shape` (the error names both shapes).
  std::vector<float> read_f32(const std::string& name, const std::vector<int64_t>& shape) const;

 private:
  std::string path_;
  std::shared_ptr<const int> fd_;  // the file that was validated; tensors are read from it, not by name again
  uint64_t data_start_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t> index_;
};


}  // namespace hpct::io
