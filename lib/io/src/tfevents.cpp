// TensorBoard event files. See tfevents.hpp.
#include "hpct/io/tfevents.hpp"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "hpct/core/error.hpp"

namespace hpct::io {
namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> a{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
      a[i] = c;
    }
    return a;
  }();
  return t;
}

// Protocol-buffer wire format: varints, tags (field << 3 | wire type), length-delimited fields.
void put_varint(std::string& s, uint64_t v) {
  while (v >= 0x80) {
    s.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
}
void put_tag(std::string& s, int field, int wire) { put_varint(s, (uint64_t(field) << 3) | uint64_t(wire)); }
void put_bytes(std::string& s, int field, const std::string& b) {
  put_tag(s, field, 2);
  put_varint(s, b.size());
  s += b;
}
template <class T>
void put_fixed(std::string& s, int field, T v) {  // double: wire type 1 (64-bit); float: 5 (32-bit)
  put_tag(s, field, sizeof(T) == 8 ? 1 : 5);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little endian on every machine we build for
  s.append(b, sizeof(T));
}
std::string event_head(double wall_time, long long step) {
  std::string e;
  put_fixed(e, 1, wall_time);
  if (step != 0) {
    put_tag(e, 2, 0);
    put_varint(e, static_cast<uint64_t>(step));  // int64: two's complement as a varint
  }
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto& t = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventFileWriter::EventFileWriter(const std::string& dir, double wall_time) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw file_error(dir, "cannot create the TensorBoard directory: " + ec.message(), "give a writable --tensorboard-dir");
  char host[256] = "host";
  gethostname(host, sizeof host - 1);
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<long long>(wall_time)) + "." + host + "." +
          std::to_string(::getpid()) + ".hpctrain";
  f_ = std::fopen(path_.c_str(), "ab");
  if (!f_) throw file_error(path_, std::string("cannot create the event file: ") + std::strerror(errno), "give a writable --tensorboard-dir");
  std::string e = event_head(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  write_record(e);
  flush();
}

EventFileWriter::~EventFileWriter() {
  if (f_) std::fclose(f_);
}

void EventFileWriter::add_scalars(const std::vector<std::pair<std::string, float>>& values, long long step, double wall_time) {
  if (values.empty()) return;
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    put_bytes(value, 1, tag);
    put_fixed(value, 2, v);
    put_bytes(summary, 1, value);
  }
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);
  write_record(e);
}

void EventFileWriter::session_start(long long step, double wall_time, const std::string& msg) {
  std::string log;
  put_tag(log, 1, 0);
  put_varint(log, 1);  // SessionLog.START
  if (!msg.empty()) put_bytes(log, 3, msg);
  std::string e = event_head(wall_time, step);
  put_bytes(e, 7, log);
  write_record(e);
}

void EventFileWriter::write_record(const std::string& payload) {
  char head[12];
  const uint64_t len = payload.size();
  std::memcpy(head, &len, 8);
  const uint32_t lc = masked_crc32c(head, 8), dc = masked_crc32c(payload.data(), payload.size());
  std::memcpy(head + 8, &lc, 4);
  char tail[4];
  std::memcpy(tail, &dc, 4);
  if (std::fwrite(head, 1, 12, f_) != 12 || std::fwrite(payload.data(), 1, payload.size(), f_) != payload.size() ||
      std::fwrite(tail, 1, 4, f_) != 4)
    throw file_error(path_, std::string("cannot write the event file: ") + std::strerror(errno));
}

void EventFileWriter::flush() {
  if (std::fflush(f_) != 0) throw file_error(path_, std::string("cannot write the event file: ") + std::strerror(errno));
}

}  // namespace hpct::io
