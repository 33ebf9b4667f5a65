// hpct/io/text_source.hpp — the lines of a corpus file as preprocess_data reads them, whether the
// file is plain text or compressed the way corpora ship (The Pile and RedPajama as .jsonl.zst,
// others as .gz or .bz2).
//
// What it is: a streaming reader that chooses its decoder by the file's first bytes (not its name):
// gzip (zlib), zstd (libzstd) and bzip2 (libbz2), concatenated members/frames/streams included, or
// none. A file that starts like another format (xz, zip, 7z, lz4, HDF5, ...) or holds a NUL byte in
// its first 64 KiB is refused as binary, naming the file: tokenizing compressed bytes as text gave a
// garbage dataset and exit 0. A truncated or corrupt compressed stream is an error naming the file.
// What it is not: random access or a parallel decoder (one stream, read once, in order).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace hpct::io {

class TextSource {
 public:
  /// Opens `path` and reads its first bytes; throws file_error naming it when it cannot be read, is
  /// binary, or is compressed in a format that is not read.
  explicit TextSource(const std::string& path);
  ~TextSource();
  TextSource(TextSource&&) noexcept;
  TextSource& operator=(TextSource&&) noexcept;

  /// The next line without its '\n' (a last line without one too); false at the end.
  bool getline(std::string& line);
  /// "none", "gzip", "zstd" or "bzip2".
  const char* compression() const;
  /// Bytes of the file read so far (compressed bytes for a compressed file).
  uint64_t file_bytes() const;
  const std::string& path() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hpct::io
