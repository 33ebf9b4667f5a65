// Shared by the lib/io tests: a fixture with a fresh scratch directory per test (and tiny
// filesystems mounted under it for the full-disk / no-O_DIRECT cases), and the IO engines this
// kernel runs.
#pragma once
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "hpct/io/aio_config.hpp"
#include "hpct/io/async_io.hpp"

namespace hpct::io::testing {

/// $TMPDIR/<prefix>_<pid>_<suite>_<test>, emptied before and removed after each test, with every
/// filesystem mount_fs() put under it detached first (last mounted, first detached).
class ScratchDirTest : public ::testing::Test {
 protected:
  explicit ScratchDirTest(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (auto& c : name)
      if (c == '/') c = '_';
    dir_ = std::filesystem::temp_directory_path() / (prefix_ + "_" + std::to_string(::getpid()) + "_" + name);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    for (auto it = mounts_.rbegin(); it != mounts_.rend(); ++it) ::umount2(it->c_str(), MNT_DETACH);
    std::filesystem::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  /// Mounts a filesystem under the scratch directory (root only); returns "" and sets why on failure.
  std::string mount_fs(const char* type, const char* opts, std::string* why) {
    std::filesystem::path m = dir_ / type;
    std::filesystem::create_directories(m);
    if (::mount(type, m.c_str(), type, 0, opts) != 0) {
      *why = std::string("cannot mount a ") + type + " (" + std::strerror(errno) + "); needs root";
      return "";
    }
    mounts_.push_back(m.string());
    return m.string();
  }
  std::string prefix_;
  std::filesystem::path dir_;
  std::vector<std::string> mounts_;
};

/// The engines this kernel runs, in ds_config preference order (io_uring, libaio, psync); the
/// others are named with the reason.
inline std::vector<AioEngine> available_engines() {
  std::vector<AioEngine> out;
  for (AioEngine e : {AioEngine::io_uring, AioEngine::libaio, AioEngine::psync}) {
    std::string why;
    if (engine_available(e, &why)) out.push_back(e);
    else std::printf("[ note ] engine %s unavailable here: %s\n", engine_name(e), why.c_str());
  }
  return out;
}

}  // namespace hpct::io::testing
