// Formatting of hpct::Error: one line, "[rank R] message (file: F, key: K) — hint: H".
#include "hpct/core/error.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace hpct {
namespace {
int g_error_rank = -1;
}

void set_error_rank(int rank) { g_error_rank = rank; }
int error_rank() { return g_error_rank; }

Error::Error(const std::string& message, Context ctx)
    : std::runtime_error(format(message, ctx, g_error_rank)), message_(message), ctx_(std::move(ctx)),
      rank_(g_error_rank) {}

Error::Error(const std::string& full_line, RelayTag)
    : std::runtime_error(full_line), message_(full_line), rank_(g_error_rank) {}

Error Error::relayed(const std::string& full_line) { return Error(full_line, RelayTag{}); }

Error Error::agreed(const std::string& full_line) {
  Error e(full_line, RelayTag{});
  e.agreed_ = true;
  return e;
}

std::string Error::format(const std::string& message, const Context& ctx, int rank) {
  std::string s;
  if (rank >= 0) s += "[rank " + std::to_string(rank) + "] ";
  s += message;
  std::string where;
  if (!ctx.file.empty()) where += "file: " + ctx.file;
  if (!ctx.key.empty()) where += std::string(where.empty() ? "" : ", ") + "key: " + ctx.key;
  if (!where.empty()) s += " (" + where + ")";
  if (!ctx.hint.empty()) s += "; hint: " + ctx.hint;
  return s;
}

Error config_error(const std::string& key, const std::string& message, const std::string& hint) {
  return Error(message, Error::Context{"", key, hint});
}

Error file_error(const std::string& file, const std::string& message, const std::string& hint) {
  return Error(message, Error::Context{file, "", hint});
}

std::string printable(const std::string& s, size_t max_chars) {
  std::string o;
  for (size_t i = 0; i < s.size() && i < max_chars; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != 0x7f) {
      o += static_cast<char>(c);
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      o += b;
    }
  }
  return s.size() > max_chars ? o + "..." : o;
}

void throw_syscall_error(const char* call, const std::string& what, int err, const char* file, int line) {
  std::string msg = what + ": " + std::strerror(err) + " [" + call + " at " + file + ":" + std::to_string(line) + "]";
  throw Error(msg);
}

}  // namespace hpct
