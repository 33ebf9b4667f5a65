// Megatron's MMIDIDX format (reference §2.3): our writer's bytes checked at their exact offsets, an
// index written byte by byte as Megatron's writer does read back unchanged, and every corruption
// refused with a message that names the file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/io/indexed_dataset.hpp"

namespace fs = std::filesystem;
using namespace hpct::io;

namespace {

using Bytes = std::vector<unsigned char>;

// A scratch directory per test, removed afterwards.
class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("hpct_idx_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string prefix(const std::string& name = "ds") const { return (dir_ / name).string(); }
  fs::path dir_;
};

// Little-endian by shifting, not memcpy: the test must not share the code's host assumption.
void put_le(Bytes& b, uint64_t v, int nbytes) {
  for (int i = 0; i < nbytes; ++i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
uint64_t get_le(const Bytes& b, size_t at, int nbytes) {
  uint64_t v = 0;
  for (int i = 0; i < nbytes; ++i) v |= static_cast<uint64_t>(b.at(at + i)) << (8 * i);
  return v;
}

Bytes slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}
void spit(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// What Megatron's MMapIndexedDataset.Index.writer emits: struct.pack of the header, then
// np.array(sizes, int32), pointers (int64), doc_idx (int64), all little-endian.
Bytes megatron_idx(uint8_t dtype_code, int itemsize, const std::vector<int32_t>& sizes, const std::vector<int64_t>& doc_idx) {
  Bytes b;
  for (char c : std::string("MMIDIDX\0\0", 9)) b.push_back(static_cast<unsigned char>(c));
  put_le(b, 1, 8);
  put_le(b, dtype_code, 1);
  put_le(b, sizes.size(), 8);
  put_le(b, doc_idx.size(), 8);
  for (int32_t s : sizes) put_le(b, static_cast<uint32_t>(s), 4);
  int64_t ptr = 0;
  for (int32_t s : sizes) {
    put_le(b, static_cast<uint64_t>(ptr), 8);
    ptr += int64_t{s} * itemsize;
  }
  for (int64_t d : doc_idx) put_le(b, static_cast<uint64_t>(d), 8);
  return b;
}

// Offsets of the header fields and arrays.
constexpr size_t kVersionAt = 9, kDtypeAt = 17, kNAt = 18, kDAt = 26, kSizesAt = 34;
size_t pointers_at(size_t n) { return kSizesAt + 4 * n; }
size_t doc_idx_at(size_t n) { return kSizesAt + 12 * n; }

// Writes a small valid uint16 dataset by hand: 3 documents of 3, 0 and 2 tokens.
void write_valid(const std::string& prefix) {
  spit(prefix + ".idx", megatron_idx(8, 2, {3, 0, 2}, {0, 1, 2, 3}));
  Bytes bin;
  for (uint16_t t : {10, 11, 12, 20, 21}) put_le(bin, t, 2);
  spit(prefix + ".bin", bin);
}

// Expects open() to throw, naming `file`, with `what` in the message.
void expect_refused(const std::string& prefix, const std::string& file, const std::string& what) {
  try {
    (void)IndexedDataset::open(prefix);
    ADD_FAILURE() << "open(" << prefix << ") accepted a bad dataset; expected: " << what;
  } catch (const hpct::Error& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

std::vector<int32_t> read_item(const IndexedDataset& ds, size_t i) {
  std::vector<int32_t> v(static_cast<size_t>(ds.sizes()[i]));
  ds.read(i, 0, v.size(), v.data());
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// dtype helpers

TEST(DType, BestFittingLikeMegatron) {
  EXPECT_EQ(best_fitting_dtype(50257), DType::uint16);  // GPT-2
  EXPECT_EQ(best_fitting_dtype(65499), DType::uint16);
  EXPECT_EQ(best_fitting_dtype(65500), DType::int32);
  EXPECT_EQ(best_fitting_dtype(128000), DType::int32);
  EXPECT_EQ(dtype_size(DType::uint16), 2u);
  EXPECT_EQ(dtype_size(DType::int32), 4u);
  EXPECT_EQ(dtype_size(DType::int64), 8u);
  EXPECT_EQ(static_cast<int>(DType::uint16), 8);
  EXPECT_EQ(static_cast<int>(DType::int32), 4);
}

// ---------------------------------------------------------------------------------------------
// Round trips with header bytes checked

using RoundTrip = TempDir;

TEST_F(RoundTrip, Uint16HeaderAndTokens) {
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {65535, 0}, {}, {7}};
  {
    IndexedDatasetBuilder b(prefix(), DType::uint16);
    for (const auto& d : docs) {
      b.add_item(d);
      b.end_document();
    }
    b.finalize();
    EXPECT_EQ(b.num_tokens(), 6u);
  }
  const Bytes idx = slurp(prefix() + ".idx");
  const size_t n = 4, d = 5;
  ASSERT_EQ(idx.size(), kSizesAt + 12 * n + 8 * d);
  EXPECT_EQ(std::memcmp(idx.data(), "MMIDIDX\0\0", 9), 0);
  EXPECT_EQ(get_le(idx, kVersionAt, 8), 1u);
  EXPECT_EQ(idx[kDtypeAt], 8);  // uint16
  EXPECT_EQ(get_le(idx, kNAt, 8), n);
  EXPECT_EQ(get_le(idx, kDAt, 8), d);
  const std::vector<uint64_t> sizes = {3, 2, 0, 1}, pointers = {0, 6, 10, 10}, doc_idx = {0, 1, 2, 3, 4};
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(get_le(idx, kSizesAt + 4 * i, 4), sizes[i]) << i;
    EXPECT_EQ(get_le(idx, pointers_at(n) + 8 * i, 8), pointers[i]) << i;
  }
  for (size_t i = 0; i < d; ++i) EXPECT_EQ(get_le(idx, doc_idx_at(n) + 8 * i, 8), doc_idx[i]) << i;
  const Bytes bin = slurp(prefix() + ".bin");
  ASSERT_EQ(bin.size(), 12u);
  EXPECT_EQ(get_le(bin, 6, 2), 65535u);

  auto ds = IndexedDataset::open(prefix());
  EXPECT_EQ(ds.dtype(), DType::uint16);
  EXPECT_EQ(ds.num_items(), n);
  EXPECT_EQ(ds.num_documents(), 4u);
  EXPECT_EQ(ds.num_tokens(), 6u);
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(read_item(ds, i), docs[i]) << i;
  int32_t part[2];
  ds.read(0, 1, 2, part);
  EXPECT_EQ(part[0], 2);
  EXPECT_EQ(part[1], 3);
}

TEST_F(RoundTrip, Int32HeaderAndTokens) {
  const std::vector<int32_t> doc = {0, 65536, 100000, 2147483647, -5};
  {
    IndexedDatasetBuilder b(prefix(), DType::int32);
    b.add_item(std::span<const int32_t>(doc.data(), 2));  // two items form one document
    b.add_item(std::span<const int32_t>(doc.data() + 2, 3));
    b.end_document();
    b.finalize();
  }
  const Bytes idx = slurp(prefix() + ".idx");
  EXPECT_EQ(idx[kDtypeAt], 4);  // int32
  EXPECT_EQ(get_le(idx, kNAt, 8), 2u);
  EXPECT_EQ(get_le(idx, kDAt, 8), 2u);
  EXPECT_EQ(get_le(idx, pointers_at(2) + 8, 8), 8u);  // second item starts after 2 int32
  EXPECT_EQ(get_le(idx, doc_idx_at(2) + 8, 8), 2u);
  EXPECT_EQ(slurp(prefix() + ".bin").size(), 20u);

  auto ds = IndexedDataset::open(prefix());
  EXPECT_EQ(ds.dtype(), DType::int32);
  EXPECT_EQ(ds.num_items(), 2u);
  EXPECT_EQ(ds.num_documents(), 1u);
  std::vector<int32_t> all = read_item(ds, 0), second = read_item(ds, 1);
  all.insert(all.end(), second.begin(), second.end());
  EXPECT_EQ(all, doc);
}

TEST_F(RoundTrip, MovedDatasetStillReads) {
  {
    IndexedDatasetBuilder b(prefix(), DType::uint16);
    std::vector<int32_t> d = {4, 5, 6};
    b.add_item(d);
    b.end_document();
    b.finalize();
  }
  auto a = IndexedDataset::open(prefix());
  IndexedDataset b = std::move(a);
  EXPECT_EQ(read_item(b, 0), (std::vector<int32_t>{4, 5, 6}));
  IndexedDataset c = IndexedDataset::open(prefix());
  c = std::move(b);
  EXPECT_EQ(read_item(c, 0), (std::vector<int32_t>{4, 5, 6}));
}

TEST_F(RoundTrip, ValueOutOfRangeForDtypeRefused) {
  IndexedDatasetBuilder b(prefix(), DType::uint16);
  std::vector<int32_t> big = {1, 65536}, neg = {-1};
  EXPECT_THROW(b.add_item(big), hpct::Error);
  EXPECT_THROW(b.add_item(neg), hpct::Error);
  EXPECT_EQ(b.num_items(), 0u);  // nothing of a refused item is kept
  try {
    b.add_item(big);
  } catch (const hpct::Error& e) {
    EXPECT_NE(std::string(e.what()).find("65536"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("uint16"), std::string::npos) << e.what();
  }
}

TEST_F(RoundTrip, NothingUnderFinalNamesUntilFinalize) {
  {
    IndexedDatasetBuilder b(prefix(), DType::uint16);
    std::vector<int32_t> d = {1, 2};
    b.add_item(d);
    b.end_document();
    EXPECT_FALSE(fs::exists(prefix() + ".bin"));
    EXPECT_FALSE(fs::exists(prefix() + ".idx"));
    // destroyed without finalize(), as when preprocessing fails half way
  }
  EXPECT_TRUE(fs::is_empty(dir_)) << "temporaries left behind";
  {
    IndexedDatasetBuilder b(prefix(), DType::uint16);
    b.finalize();  // an empty dataset is valid: N = 0, doc_idx = [0]
  }
  auto ds = IndexedDataset::open(prefix());
  EXPECT_EQ(ds.num_items(), 0u);
  EXPECT_EQ(ds.num_documents(), 0u);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2);
}

TEST_F(RoundTrip, ReadOutsideItemRefused) {
  write_valid(prefix());
  auto ds = IndexedDataset::open(prefix());
  int32_t out[4];
  EXPECT_THROW(ds.read(3, 0, 1, out), hpct::Error);
  EXPECT_THROW(ds.read(0, 2, 2, out), hpct::Error);
  EXPECT_NO_THROW(ds.read(0, 3, 0, out));
}

// ---------------------------------------------------------------------------------------------
// An index written the way Megatron writes it

using MegatronFile = TempDir;

TEST_F(MegatronFile, Uint16DocumentsReadUnchanged) {
  write_valid(prefix());
  auto ds = IndexedDataset::open(prefix());
  EXPECT_EQ(ds.dtype(), DType::uint16);
  EXPECT_EQ(ds.num_items(), 3u);
  EXPECT_EQ(ds.num_documents(), 3u);
  EXPECT_EQ(std::vector<int32_t>(ds.sizes().begin(), ds.sizes().end()), (std::vector<int32_t>{3, 0, 2}));
  EXPECT_EQ(std::vector<int64_t>(ds.pointers().begin(), ds.pointers().end()), (std::vector<int64_t>{0, 6, 6}));
  EXPECT_EQ(std::vector<int64_t>(ds.doc_idx().begin(), ds.doc_idx().end()), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(read_item(ds, 0), (std::vector<int32_t>{10, 11, 12}));
  EXPECT_TRUE(read_item(ds, 1).empty());
  EXPECT_EQ(read_item(ds, 2), (std::vector<int32_t>{20, 21}));
}

TEST_F(MegatronFile, Int64SentencesGroupedIntoDocuments) {
  // Megatron's builder default dtype (int64), with --split-sentences: 5 sentences in 2 documents.
  spit(prefix() + ".idx", megatron_idx(5, 8, {2, 1, 3, 1, 2}, {0, 3, 5}));
  Bytes bin;
  for (uint64_t t : {1, 2, 3, 4, 5, 6, 7, 50256, 9}) put_le(bin, t, 8);
  spit(prefix() + ".bin", bin);
  auto ds = IndexedDataset::open(prefix());
  EXPECT_EQ(ds.dtype(), DType::int64);
  EXPECT_EQ(ds.num_items(), 5u);
  EXPECT_EQ(ds.num_documents(), 2u);
  EXPECT_EQ(read_item(ds, 2), (std::vector<int32_t>{4, 5, 6}));
  EXPECT_EQ(read_item(ds, 3), (std::vector<int32_t>{7}));
  EXPECT_EQ(read_item(ds, 4), (std::vector<int32_t>{50256, 9}));
}

TEST_F(MegatronFile, Int64TokenBeyondInt32RefusedOnRead) {
  spit(prefix() + ".idx", megatron_idx(5, 8, {1}, {0, 1}));
  Bytes bin;
  put_le(bin, uint64_t{1} << 40, 8);
  spit(prefix() + ".bin", bin);
  auto ds = IndexedDataset::open(prefix());
  int32_t out;
  EXPECT_THROW(ds.read(0, 0, 1, &out), hpct::Error);
}

// ---------------------------------------------------------------------------------------------
// Corruptions: each refused on open, naming the file

using Corrupt = TempDir;

TEST_F(Corrupt, MissingIndex) {
  expect_refused(prefix("nothing"), prefix("nothing") + ".idx", "not found");
}

TEST_F(Corrupt, MissingData) {
  write_valid(prefix());
  fs::remove(prefix() + ".bin");
  expect_refused(prefix(), prefix() + ".bin", "not found");
}

// A directory or FIFO at the .bin's path is named as such (a directory read as 2^63-1 bytes; a FIFO
// would block the open).
TEST_F(Corrupt, DataIsADirectoryOrFifo) {
  write_valid(prefix());
  fs::remove(prefix() + ".bin");
  fs::create_directory(prefix() + ".bin");
  expect_refused(prefix(), prefix() + ".bin", "is a directory");
  fs::remove(prefix() + ".bin");
  ASSERT_EQ(::mkfifo((prefix() + ".bin").c_str(), 0600), 0);
  expect_refused(prefix(), prefix() + ".bin", "not a regular file");
}

TEST_F(Corrupt, BadMagic) {
  write_valid(prefix());
  Bytes idx = slurp(prefix() + ".idx");
  idx[3] = 'X';
  spit(prefix() + ".idx", idx);
  expect_refused(prefix(), prefix() + ".idx", "bad magic");
}

TEST_F(Corrupt, LegacyFormat) {
  Bytes idx;
  for (char c : std::string("TNTIDX\0\0", 8)) idx.push_back(static_cast<unsigned char>(c));
  put_le(idx, 1, 8);
  spit(prefix() + ".idx", idx);
  spit(prefix() + ".bin", {});
  expect_refused(prefix(), prefix() + ".idx", "TNTIDX");
}

TEST_F(Corrupt, UnsupportedVersion) {
  write_valid(prefix());
  Bytes idx = slurp(prefix() + ".idx");
  idx[kVersionAt] = 2;
  spit(prefix() + ".idx", idx);
  expect_refused(prefix(), prefix() + ".idx", "unsupported index version 2");
}

TEST_F(Corrupt, UnknownDtypeCode) {
  write_valid(prefix());
  Bytes idx = slurp(prefix() + ".idx");
  idx[kDtypeAt] = 9;
  spit(prefix() + ".idx", idx);
  expect_refused(prefix(), prefix() + ".idx", "unknown dtype code 9");
  idx[kDtypeAt] = 0;
  spit(prefix() + ".idx", idx);
  expect_refused(prefix(), prefix() + ".idx", "unknown dtype code 0");
}

TEST_F(Corrupt, HeaderTruncated) {
  write_valid(prefix());
  Bytes idx = slurp(prefix() + ".idx");
  idx.erase(idx.begin() + 20, idx.end());
  spit(prefix() + ".idx", idx);
  expect_refused(prefix(), prefix() + ".idx", "too short");
}

TEST_F(Corrupt, IndexTooShortForNAndD) {
  write_valid(prefix());
  Bytes idx = slurp(prefix() + ".idx");
  idx.erase(idx.end() - 8, idx.end());  // the last doc_idx entry is missing
  spit(prefix() + ".idx", idx);
  expect_refused(prefix(), prefix() + ".idx", "too short for N=3 items and D=4");
}

TEST_F(Corrupt, AbsurdCountsDoNotOverflow) {
  write_valid(prefix());
  Bytes idx = slurp(prefix() + ".idx");
  for (int i = 0; i < 8; ++i) idx[kNAt + i] = 0xff;
  spit(prefix() + ".idx", idx);
  expect_refused(prefix(), prefix() + ".idx", "too short");
}

TEST_F(Corrupt, TrailingBytes) {
  write_valid(prefix());
  Bytes idx = slurp(prefix() + ".idx");
  idx.push_back(0);
  spit(prefix() + ".idx", idx);
  expect_refused(prefix(), prefix() + ".idx", "trailing bytes");
}

TEST_F(Corrupt, NegativeSize) {
  spit(prefix() + ".idx", megatron_idx(8, 2, {2, -1}, {0, 1, 2}));
  spit(prefix() + ".bin", Bytes(4));
  expect_refused(prefix(), prefix() + ".idx", "negative size");
}

TEST_F(Corrupt, PointersInconsistentWithSizes) {
  write_valid(prefix());
  Bytes idx = slurp(prefix() + ".idx");
  idx[pointers_at(3) + 8 * 2] = 4;  // item 2 claims byte 4, but items 0 and 1 end at byte 6
  spit(prefix() + ".idx", idx);
  expect_refused(prefix(), prefix() + ".idx", "pointer of item 2 is 4, expected 6");
}

TEST_F(Corrupt, DocIdxNotStartingAtZero) {
  spit(prefix() + ".idx", megatron_idx(8, 2, {3, 0, 2}, {1, 2, 3}));
  spit(prefix() + ".bin", Bytes(10));
  expect_refused(prefix(), prefix() + ".idx", "doc_idx must start with 0");
}

TEST_F(Corrupt, DocIdxNotMonotone) {
  spit(prefix() + ".idx", megatron_idx(8, 2, {3, 0, 2}, {0, 2, 1, 3}));
  spit(prefix() + ".bin", Bytes(10));
  expect_refused(prefix(), prefix() + ".idx", "doc_idx is not monotone");
}

TEST_F(Corrupt, DocIdxNotEndingAtN) {
  spit(prefix() + ".idx", megatron_idx(8, 2, {3, 0, 2}, {0, 1, 2}));
  spit(prefix() + ".bin", Bytes(10));
  expect_refused(prefix(), prefix() + ".idx", "doc_idx ends at 2, expected N=3");
}

TEST_F(Corrupt, DataFileShort) {
  write_valid(prefix());
  Bytes bin = slurp(prefix() + ".bin");
  bin.pop_back();
  spit(prefix() + ".bin", bin);
  expect_refused(prefix(), prefix() + ".bin", "data file has 9 bytes, expected 10");
}

TEST_F(Corrupt, DataFileLong) {
  write_valid(prefix());
  Bytes bin = slurp(prefix() + ".bin");
  bin.push_back(0);
  bin.push_back(0);
  spit(prefix() + ".bin", bin);
  expect_refused(prefix(), prefix() + ".bin", "data file has 12 bytes, expected 10");
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
