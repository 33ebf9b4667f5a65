// hpct/io/indexed_dataset.hpp — Megatron's MMapIndexedDataset (.bin/.idx, "MMIDIDX"), read and written
// byte for byte as megatron/data/indexed_dataset.py does, so datasets move freely between the two.
//
// Not here: the legacy "TNTIDX" format, blending several prefixes, and sample building (gpt_dataset.hpp).
// Trade-off: the index arrays (sizes, pointers, doc_idx) are copied into aligned vectors at open,
// because in the file they start at byte 34 and are never aligned for int32/int64 access. That
// costs 12 bytes per item and one pass we make anyway to validate them; the tokens themselves stay
// memory-mapped and are read in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace hpct::io {

/// Megatron's dtype codes (indexed_dataset.py `dtypes`); the numbers are what the .idx stores.
enum class DType : uint8_t {
  uint8 = 1,
  int8 = 2,
  int16 = 3,
  int32 = 4,
  int64 = 5,
  float64 = 6,
  float32 = 7,
  uint16 = 8,
};

/// Bytes per element of dt.
size_t dtype_size(DType dt);
/// "uint16", "int32", ... for messages.
const char* dtype_name(DType dt);
/// Megatron's best_fitting_dtype: uint16 when vocab_size < 65500, else int32.
DType best_fitting_dtype(size_t vocab_size);

/// prefix + ".idx" / prefix + ".bin", the names Megatron's --data-path expects.
std::string index_file_path(const std::string& prefix);
std::string data_file_path(const std::string& prefix);

/// Writes a dataset. Tokens stream into a temporary .bin as they come; finalize() writes the .idx
/// and only then renames both into place, so a crash never leaves a half dataset under the final
/// names (the destructor removes the temporaries of an unfinalized builder).
class IndexedDatasetBuilder {
 public:
  /// Integer dtypes only (uint8, int8, int16, uint16, int32, int64): token ids are integers.
  IndexedDatasetBuilder(std::string prefix, DType dtype);
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  /// Appends one item (a document, or a sentence with --split-sentences). Throws hpct::Error when a
  /// value does not fit the dtype, before anything of the item is written.
  void add_item(std::span<const int32_t> tokens);
  /// Closes the current document: the items added since the last call form one document.
  void end_document();
  /// Writes the .idx and renames both files into place. Items after the last end_document() are
  /// written but belong to no document, exactly as Megatron's builder does.
  void finalize();

  size_t num_items() const { return sizes_.size(); }
  size_t num_documents() const { return doc_idx_.size() - 1; }
  uint64_t num_tokens() const { return num_tokens_; }
  DType dtype() const { return dtype_; }

 private:
  void write_bin(const void* data, size_t bytes);

  std::string prefix_;
  DType dtype_;
  std::string tmp_bin_, tmp_idx_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> doc_idx_{0};
  std::vector<unsigned char> scratch_;  // one item converted to dtype_
  uint64_t num_tokens_ = 0;
  bool finalized_ = false;
};

/// A dataset opened read-only: the validated index in memory, the tokens memory-mapped.
/// Movable, not copyable; const methods are safe to call from several threads.
class IndexedDataset {
 public:
  /// Opens prefix.idx and prefix.bin and validates them; each problem is one hpct::Error that names
  /// the file and what was expected.
  static IndexedDataset open(const std::string& prefix);

  IndexedDataset(IndexedDataset&& other) noexcept;
  IndexedDataset& operator=(IndexedDataset&& other) noexcept;
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;
  ~IndexedDataset();

  size_t num_items() const { return sizes_.size(); }
  /// Documents, i.e. len(doc_idx) - 1. Equal to num_items() for datasets built per document.
  size_t num_documents() const { return doc_idx_.size() - 1; }
  uint64_t num_tokens() const { return num_tokens_; }
  DType dtype() const { return dtype_; }
  const std::string& prefix() const { return prefix_; }

  std::span<const int32_t> sizes() const { return sizes_; }      // (N) tokens per item
  std::span<const int64_t> pointers() const { return pointers_; }  // (N) byte offsets into .bin
  std::span<const int64_t> doc_idx() const { return doc_idx_; }    // (D) first item of each document, then N

  /// Copies tokens [offset, offset + length) of item into out, converted to int32. Throws when the
  /// range is outside the item or a stored value does not fit int32.
  void read(size_t item, size_t offset, size_t length, int32_t* out) const;

 private:
  IndexedDataset() = default;
  void release() noexcept;

  std::string prefix_;
  DType dtype_ = DType::uint16;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> doc_idx_{0};
  uint64_t num_tokens_ = 0;
  const unsigned char* bin_ = nullptr;  // the mapped .bin; null when it is empty
  size_t bin_bytes_ = 0;
};

}  // namespace hpct::io
