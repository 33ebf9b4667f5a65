// Bounded reads of regular files and atomic replacement of files (hpct/core/file.hpp).
#include "hpct/core/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "hpct/core/error.hpp"
#include "hpct/core/units.hpp"

namespace hpct {

namespace {
const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}
}  // namespace

std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes,
                              const std::string& hint) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw file_error(path, "cannot open " + what + ": " + std::strerror(errno), hint);
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string kind = kind_of(st.st_mode);
    ::close(fd);
    throw file_error(path, what + " is " + kind + ", not a regular file", hint);
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw file_error(path, what + " holds " + format_bytes(double(st.st_size)) + ", more than the " +
                               format_bytes(double(max_bytes)) + " such a file may have", hint);
  }
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      throw file_error(path, "cannot read " + what + ": " + (err ? std::strerror(err) : "it shrank while being read"), hint);
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return data;
}

void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& body) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  ::unlink(tmp.c_str());  // a stale one of an earlier process with this pid (or a planted link): gone
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    throw file_error(path, std::string("cannot write: ") + std::strerror(errno), "check that its directory exists and is writable");
  std::FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw file_error(path, "cannot write (fdopen failed)");
  }
  bool ok = true;
  try {
    body(f);
  } catch (...) {
    std::fclose(f);
    ::unlink(tmp.c_str());
    throw;
  }
  ok = std::fflush(f) == 0 && !std::ferror(f);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    ::unlink(tmp.c_str());
    throw file_error(path, "short write (disk full?)", "the previous file, if any, is unchanged");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw file_error(path, std::string("cannot rename the temporary file into place: ") + std::strerror(err),
                     "the previous file, if any, is unchanged");
  }
}

}  // namespace hpct
