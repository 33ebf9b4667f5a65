// core/file.hpp: bounded reads of regular files only, and replacement that never writes through a
// link planted at the path (issue 47, items 4 and 12).
#include "hpct/core/file.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "hpct/core/error.hpp"

namespace fs = std::filesystem;
using namespace hpct;

namespace {

class FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hpct_test_file_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const auto p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  static std::string slurp(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), {}};
  }
  std::string error_of(const std::string& path, uint64_t max = 1 << 20) {
    try {
      read_regular_file(path, "test file", max);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(FileTest, ReadsARegularFileWhole) {
  const std::string text("a\0b\nc", 5);
  EXPECT_EQ(read_regular_file(write("x", text), "test file", 5), text);
  EXPECT_EQ(read_regular_file(write("empty", ""), "test file", 0), "");
}

TEST_F(FileTest, RefusesWhatIsNotARegularFileWithoutBlocking) {
  EXPECT_NE(error_of("/dev/zero").find("test file is a character device, not a regular file"), std::string::npos);
  EXPECT_NE(error_of(dir_.string()).find("is a directory"), std::string::npos);
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(error_of(fifo).find("is a FIFO"), std::string::npos);  // no writer: a blocking open would hang here
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_NE(error_of((dir_ / "absent").string()).find("cannot open test file: No such file or directory"), std::string::npos);
}

TEST_F(FileTest, RefusesAFileOverItsBound) {
  const std::string p = write("big", std::string(1001, 'x'));
  EXPECT_NE(error_of(p, 1000).find("more than the"), std::string::npos);
  EXPECT_EQ(read_regular_file(p, "test file", 1001).size(), 1001u);
}

TEST_F(FileTest, AtomicWriteReplacesALinkInsteadOfWritingThroughIt) {
  const std::string victim = write("victim", "untouched");
  const std::string out = (dir_ / "out").string();
  fs::create_symlink(victim, out);
  // A link planted at the temporary name as well.
  fs::create_symlink(victim, out + ".tmp." + std::to_string(::getpid()));
  write_file_atomic(out, [](std::FILE* f) { std::fputs("new", f); });
  EXPECT_FALSE(fs::is_symlink(out));
  EXPECT_EQ(slurp(out), "new");
  EXPECT_EQ(slurp(victim), "untouched");
  EXPECT_FALSE(fs::exists(fs::symlink_status(out + ".tmp." + std::to_string(::getpid()))));
}

TEST_F(FileTest, AFailedWriteLeavesTheOldFile) {
  const std::string out = write("keep", "old");
  EXPECT_THROW(write_file_atomic(out, [](std::FILE*) { throw Error("stop"); }), Error);
  EXPECT_EQ(slurp(out), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator{}), 1);  // no temporary left
  EXPECT_THROW(write_file_atomic((dir_ / "no_dir" / "x").string(), [](std::FILE*) {}), Error);
}

}  // namespace
