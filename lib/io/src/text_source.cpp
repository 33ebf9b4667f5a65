// Corpus lines from plain or compressed files (hpct/io/text_source.hpp).
#include "hpct/io/text_source.hpp"

#include <bzlib.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "hpct/core/error.hpp"

namespace hpct::io {

namespace {

constexpr size_t kChunk = size_t{1} << 20;  // bytes read from the file at a time
constexpr size_t kSniff = size_t{64} << 10;  // plain text: no NUL byte in the first 64 KiB

bool starts_with(const unsigned char* p, size_t n, std::initializer_list<unsigned char> magic) {
  if (n < magic.size()) return false;
  return std::equal(magic.begin(), magic.end(), p);
}

// A format we do not read, known by its first bytes: named in the refusal.
const char* other_format(const unsigned char* p, size_t n) {
  if (starts_with(p, n, {0xFD, '7', 'z', 'X', 'Z', 0x00})) return "xz";
  if (starts_with(p, n, {'P', 'K', 0x03, 0x04})) return "zip";
  if (starts_with(p, n, {'7', 'z', 0xBC, 0xAF, 0x27, 0x1C})) return "7z";
  if (starts_with(p, n, {0x04, 0x22, 0x4D, 0x18})) return "lz4";
  if (starts_with(p, n, {0x89, 'H', 'D', 'F', '\r', '\n', 0x1A, '\n'})) return "HDF5";
  if (starts_with(p, n, {'P', 'A', 'R', '1'})) return "Parquet";
  if (starts_with(p, n, {0x93, 'N', 'U', 'M', 'P', 'Y'})) return "NumPy";
  return nullptr;
}

}  // namespace

struct TextSource::Impl {
  enum class Kind { none, gzip, zstd, bzip2 };
  std::string path;
  std::FILE* f = nullptr;
  Kind kind = Kind::none;
  std::vector<unsigned char> in;  // raw bytes from the file: [in_pos, in_end) not yet decoded
  size_t in_pos = 0, in_end = 0;
  bool file_eof = false;
  uint64_t file_bytes = 0;
  std::string out;  // decoded bytes: [out_pos, out.size()) not yet returned
  size_t out_pos = 0;
  bool decoder_done = false;  // the last compressed stream ended and the file has no more
  z_stream z{};
  bool z_open = false;
  ZSTD_DStream* zs = nullptr;
  bz_stream bz{};
  bool bz_open = false;

  ~Impl() {
    if (z_open) inflateEnd(&z);
    if (zs) ZSTD_freeDStream(zs);
    if (bz_open) BZ2_bzDecompressEnd(&bz);
    if (f) std::fclose(f);
  }

  [[noreturn]] void fail(const std::string& why, const std::string& hint = "") const { throw file_error(path, why, hint); }

  // Tops up the raw buffer; false when nothing is left in it and the file is at its end.
  bool fill() {
    if (in_pos < in_end) return true;
    if (file_eof) return false;
    in_pos = 0;
    in_end = std::fread(in.data(), 1, in.size(), f);
    if (in_end < in.size()) {
      if (std::ferror(f)) fail(std::string("read error: ") + std::strerror(errno));
      file_eof = true;
    }
    file_bytes += in_end;
    return in_end > 0;
  }

  const char* name() const {
    switch (kind) {
      case Kind::gzip: return "gzip";
      case Kind::zstd: return "zstd";
      case Kind::bzip2: return "bzip2";
      default: return "none";
    }
  }

  void truncated() const {
    fail(std::string("its ") + name() + " stream ends before its end marker: the file is truncated or damaged");
  }

  // Decodes more into `out`; false at the end of the data.
  bool decode() {
    if (decoder_done) return false;
    if (kind == Kind::none) {
      if (!fill()) return decoder_done = true, false;
      for (size_t i = in_pos; i < in_end; ++i)
        if (in[i] == 0) fail("holds a NUL byte at offset " + std::to_string(file_bytes - (in_end - i)) + ": not a text corpus");
      out.append(reinterpret_cast<const char*>(in.data()) + in_pos, in_end - in_pos);
      in_pos = in_end;
      return true;
    }
    const size_t before = out.size();
    out.resize(before + kChunk);
    size_t produced = 0;
    bool stream_end = false;
    if (!fill()) {
      out.resize(before);
      truncated();
    }
    const size_t avail = in_end - in_pos;
    if (kind == Kind::gzip) {
      z.next_in = in.data() + in_pos;
      z.avail_in = static_cast<uInt>(avail);
      z.next_out = reinterpret_cast<Bytef*>(out.data() + before);
      z.avail_out = static_cast<uInt>(kChunk);
      const int rc = inflate(&z, Z_NO_FLUSH);
      if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
        fail(std::string("gzip data is corrupt: ") + (z.msg ? z.msg : "inflate error " + std::to_string(rc)));
      in_pos += avail - z.avail_in;
      produced = kChunk - z.avail_out;
      stream_end = rc == Z_STREAM_END;
      if (stream_end) inflateReset(&z);  // another member may follow
    } else if (kind == Kind::zstd) {
      ZSTD_inBuffer ib{in.data() + in_pos, avail, 0};
      ZSTD_outBuffer ob{out.data() + before, kChunk, 0};
      const size_t rc = ZSTD_decompressStream(zs, &ob, &ib);
      if (ZSTD_isError(rc)) fail(std::string("zstd data is corrupt: ") + ZSTD_getErrorName(rc));
      in_pos += ib.pos;
      produced = ob.pos;
      stream_end = rc == 0;  // a frame is complete (another may follow)
    } else {
      bz.next_in = reinterpret_cast<char*>(in.data() + in_pos);
      bz.avail_in = static_cast<unsigned>(avail);
      bz.next_out = out.data() + before;
      bz.avail_out = static_cast<unsigned>(kChunk);
      const int rc = BZ2_bzDecompress(&bz);
      if (rc != BZ_OK && rc != BZ_STREAM_END) fail("bzip2 data is corrupt (libbz2 error " + std::to_string(rc) + ")");
      in_pos += avail - bz.avail_in;
      produced = kChunk - bz.avail_out;
      stream_end = rc == BZ_STREAM_END;
      if (stream_end) {  // another stream may follow (pbzip2 writes several)
        BZ2_bzDecompressEnd(&bz);
        bz = bz_stream{};
        if (BZ2_bzDecompressInit(&bz, 0, 0) != BZ_OK) fail("cannot start the bzip2 decoder");
      }
    }
    out.resize(before + produced);
    if (stream_end && in_pos == in_end && !fill()) decoder_done = true;  // the last stream ended with the file
    else if (!stream_end && produced == 0 && in_pos == in_end && file_eof) truncated();
    return produced > 0 || !decoder_done;
  }
};

TextSource::TextSource(const std::string& path) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  m.f = std::fopen(path.c_str(), "rb");
  if (!m.f) throw file_error(path, std::string("cannot open the input file: ") + std::strerror(errno));
  m.in.resize(kChunk);
  m.fill();
  const unsigned char* p = m.in.data();
  const size_t n = m.in_end;
  if (starts_with(p, n, {0x1F, 0x8B})) {
    m.kind = Impl::Kind::gzip;
    if (inflateInit2(&m.z, 15 + 16) != Z_OK) m.fail("cannot start the gzip decoder");
    m.z_open = true;
  } else if (starts_with(p, n, {0x28, 0xB5, 0x2F, 0xFD})) {
    m.kind = Impl::Kind::zstd;
    m.zs = ZSTD_createDStream();
    if (!m.zs || ZSTD_isError(ZSTD_initDStream(m.zs))) m.fail("cannot start the zstd decoder");
  } else if (starts_with(p, n, {'B', 'Z', 'h'}) && n > 3 && p[3] >= '1' && p[3] <= '9') {
    m.kind = Impl::Kind::bzip2;
    if (BZ2_bzDecompressInit(&m.bz, 0, 0) != BZ_OK) m.fail("cannot start the bzip2 decoder");
    m.bz_open = true;
  } else if (const char* other = other_format(p, n)) {
    m.fail(std::string("is ") + other + " data, not text", "give text or JSONL, plain or compressed with gzip, zstd or bzip2");
  } else if (std::memchr(p, 0, std::min(n, kSniff))) {
    m.fail("holds NUL bytes in its first 64 KiB: a binary file, not text",
           "give text or JSONL, plain or compressed with gzip, zstd or bzip2");
  }
}

TextSource::~TextSource() = default;
TextSource::TextSource(TextSource&&) noexcept = default;
TextSource& TextSource::operator=(TextSource&&) noexcept = default;

bool TextSource::getline(std::string& line) {
  Impl& m = *impl_;
  for (;;) {
    const size_t nl = m.out.find('\n', m.out_pos);
    if (nl != std::string::npos) {
      line.assign(m.out, m.out_pos, nl - m.out_pos);
      m.out_pos = nl + 1;
      return true;
    }
    if (m.out_pos > 0) {  // keep only the partial line
      m.out.erase(0, m.out_pos);
      m.out_pos = 0;
    }
    if (!m.decode()) {
      if (m.out.empty()) return false;
      line = std::move(m.out);  // a last line without '\n'
      m.out.clear();
      return true;
    }
  }
}

const char* TextSource::compression() const { return impl_->name(); }
uint64_t TextSource::file_bytes() const { return impl_->file_bytes; }
const std::string& TextSource::path() const { return impl_->path; }

}  // namespace hpct::io
