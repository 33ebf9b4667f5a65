// hpct/core/file.hpp — reading a file whose path came from input we do not control (a checkpoint's
// config, a flags file), and replacing a file without following what is planted at its path.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace hpct {

/// The whole of a regular file of at most `max_bytes`. The open never blocks (O_NONBLOCK: a FIFO
/// planted at the path is refused, not waited on) and a device, directory or socket is refused
/// before any read, so /dev/zero or /dev/urandom cannot stream forever. Throws file_error naming
/// the path, `what` the file is ("GPT-2 vocab file") and why.
std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes,
                              const std::string& hint = "");

/// Writes `path` through a new temporary file beside it (created O_EXCL | O_NOFOLLOW) renamed into
/// place: a reader or a crash sees the old file or the new one, and a symbolic link planted at
/// `path` or at the temporary name is replaced, never written through. `body` writes the content
/// to the stream; the stream's error state is checked after it. Throws file_error naming `path`.
void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& body);

}  // namespace hpct
