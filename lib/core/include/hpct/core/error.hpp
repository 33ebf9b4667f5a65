// hpct/core/error.hpp — the one error type of hpctrain, and checked-call macros.
//
// Every usage, config and IO problem is thrown as hpct::Error, carrying where it happened
// (file, key, rank) and an optional hint, so an app's main() can print exactly one clear line.
// This header knows nothing of MPI or CUDA (core is the bottom layer): the comm layer adds its
// own HPCT_CHECK_MPI on top of the same type, and fills in the rank through set_error_rank().
#pragma once

#include <stdexcept>
#include <string>

namespace hpct {

/// Process-wide rank used to label errors; -1 means "not in an MPI job (yet)". Set by comm.
void set_error_rank(int rank);
int error_rank();

/// The single exception type. what() is the full one-line message.
class Error : public std::runtime_error {
 public:
  struct Context {
    std::string file;  // the input file concerned (config, dataset, checkpoint), if any
    std::string key;   // the config key or flag concerned, if any
    std::string hint;  // what would be right, if we know
  };
  explicit Error(const std::string& message) : Error(message, Context{}) {}
  Error(const std::string& message, Context ctx);

  /// An error raised on one rank and passed on by another (e.g. after an all-gather of errors):
  /// `full_line` already says where it happened ("[rank 3] ..."), so no rank prefix is added.
  static Error relayed(const std::string& full_line);
  /// The same error thrown on every rank of the job at once (after an all-gather over the whole
  /// world): the job can end without an abort, one rank reporting it.
  static Error agreed(const std::string& full_line);
  bool is_agreed() const { return agreed_; }

  const std::string& message() const { return message_; }
  const Context& context() const { return ctx_; }
  int rank() const { return rank_; }

 private:
  struct RelayTag {};
  Error(const std::string& full_line, RelayTag);
  static std::string format(const std::string& message, const Context& ctx, int rank);
  std::string message_;
  Context ctx_;
  int rank_;
  bool agreed_ = false;
};

/// Convenience constructors that read well at the throw site.
Error config_error(const std::string& key, const std::string& message, const std::string& hint = "");
Error file_error(const std::string& file, const std::string& message, const std::string& hint = "");

/// Text read from a file, made fit for a one-line message: control characters as \xNN, cut at
/// max_chars with "...".
std::string printable(const std::string& s, size_t max_chars = 120);

/// Throws hpct::Error with errno text for a failed syscall: "open(path): No such file ... [at file:line]".
[[noreturn]] void throw_syscall_error(const char* call, const std::string& what, int err, const char* file,
                                      int line);

}  // namespace hpct

/// Checks a syscall-style result (< 0 means failure, errno set) and throws with file:line.
#define HPCT_CHECK_SYS(expr, what)                                              \
  do {                                                                          \
    if ((expr) < 0) ::hpct::throw_syscall_error(#expr, (what), errno, __FILE__, __LINE__); \
  } while (0)

/// A runtime condition that depends on input: throws, never asserts.
#define HPCT_REQUIRE(cond, msg)                                   \
  do {                                                            \
    if (!(cond)) throw ::hpct::Error(std::string(msg));           \
  } while (0)
