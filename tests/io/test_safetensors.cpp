// The safetensors reader against hostile headers (issue 17, item 1): each case must be refused with
// one hpct::Error naming the file and, where there is one, the tensor; a well-formed file reads back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/core/json_config.hpp"
#include "hpct/io/safetensors.hpp"

using hpct::io::SafetensorsFile;

namespace {

// Refused, with a message that contains `want` and names `where`.
void refused(const std::string& header, uint64_t data_bytes, const std::string& want) {
  try {
    SafetensorsFile::parse_header(header, data_bytes, "model.safetensors");
    FAIL() << "accepted: " << header;
  } catch (const hpct::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(want), std::string::npos) << m;
    EXPECT_NE(m.find("model.safetensors"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << "one line: " << m;
  }
}

// Every file a test writes, removed when the process ends.
struct Cleanup {
  std::vector<std::string> paths;
  ~Cleanup() {
    for (const auto& p : paths) ::unlink(p.c_str());
  }
};
Cleanup g_cleanup;

std::string file_with(const std::string& header, const std::vector<float>& data, uint64_t extra_bytes = 0) {
  static int n = 0;
  std::string path = ::testing::TempDir() + "/st_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ".safetensors";
  g_cleanup.paths.push_back(path);
  std::ofstream o(path, std::ios::binary | std::ios::trunc);
  uint64_t hl = header.size();
  o.write(reinterpret_cast<const char*>(&hl), 8);
  o << header;
  o.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * 4));
  for (uint64_t i = 0; i < extra_bytes; ++i) o.put('\0');
  return path;
}

}  // namespace

TEST(Safetensors, WellFormedReadsBack) {
  const std::string h = R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]},)"
                        R"("a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
  auto path = file_with(h, {1, 2, 3, 4, 5});
  auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.read_f32("a", {3}), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(f.read_f32("b", {2}), (std::vector<float>{4, 5}));
  EXPECT_THROW(f.read_f32("b", {1, 2}), hpct::Error);  // shape must match exactly
  EXPECT_THROW(f.read_f32("c", {2}), hpct::Error);
}

// 16-bit tensors (Hugging Face's F16 and BF16 checkpoints) are widened exactly: every F16 pattern
// against IEEE half's definition computed with ldexp (NaN only needs to stay NaN; -0 keeps its
// sign), BF16 by its top half.
TEST(Safetensors, SixteenBitTensorsWidenExactly) {
  std::vector<uint16_t> bits(65536 + 4);
  for (size_t i = 0; i < 65536; ++i) bits[i] = static_cast<uint16_t>(i);
  const uint16_t bf[4] = {0x3f80, 0xc000, 0x0001, 0x7f80};  // 1, -2, the smallest subnormal, inf
  std::copy(bf, bf + 4, bits.begin() + 65536);
  std::vector<float> data(bits.size() / 2);
  std::memcpy(data.data(), bits.data(), bits.size() * 2);
  const std::string h = R"({"h":{"dtype":"F16","shape":[256,256],"data_offsets":[0,131072]},)"
                        R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[131072,131080]}})";
  auto f = SafetensorsFile::open(file_with(h, data));
  const std::vector<float> x = f.read_f32("h", {256, 256});
  int bad = 0;
  for (size_t i = 0; i < 65536; ++i) {  // IEEE half by its definition, in arithmetic, not bits
    const int sign = (i >> 15) & 1, e = (i >> 10) & 31, m = i & 1023;
    float want = e == 0 ? std::ldexp(float(m), -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(float(1024 + m), e - 25);
    if (sign) want = -want;
    bad += std::isnan(want) ? !std::isnan(x[i]) : std::memcmp(&want, &x[i], 4) != 0;
  }
  EXPECT_EQ(bad, 0);
  const std::vector<float> b = f.read_f32("b", {4});
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -2.0f);
  EXPECT_EQ(b[2], std::ldexp(1.0f, -133));
  EXPECT_TRUE(std::isinf(b[3]));
}

// The case of the report: a 1-element tensor whose offsets span 400000 bytes (heap overflow before).
TEST(Safetensors, OffsetsLongerThanShape) {
  refused(R"({"ln_f.bias":{"dtype":"F32","shape":[1],"data_offsets":[0,400000]}})", 400000,
          "spans 400000 bytes of data, its F32 shape [1] needs 4");
}

TEST(Safetensors, ShapeLargerThanOffsets) {  // wte.weight whose shape disagrees with its data
  refused(R"({"wte.weight":{"dtype":"F32","shape":[8,4],"data_offsets":[0,64]}})", 64, "needs 128");
}

TEST(Safetensors, OffsetsOutOfFile) {
  refused(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, "the file is truncated");
  refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[100,104]}})", 104, "gap");
}

TEST(Safetensors, OverlappingReversedNegative) {
  refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          12, "overlap");
  refused(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8, "end before they begin");
  refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 0, "two non-negative integers");
  refused(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "non-negative integer");
  refused(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4, "non-negative integer");
}

TEST(Safetensors, ShapeProductOverflow) {
  refused(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4, "overflows");
  refused(R"({"a":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})", 4, "non-negative integer");
}

TEST(Safetensors, MissingOrMalformedFields) {
  refused(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4, "no dtype");
  refused(R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4, "no dtype");
  refused(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}})", 4, "unknown dtype 'Q4'");
  refused(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4, "no shape");
  refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, "data_offsets [begin, end]");
  refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 4, "data_offsets [begin, end]");
  refused(R"({"a":{"dtype":"F32","shape":[1]}})", 4, "data_offsets");
  refused(R"({"a":[1,2]})", 4, "is not a JSON object");
  refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4, "unknown key 'x'");
  refused(R"({"__metadata__":3})", 0, "__metadata__");
  refused(R"([1,2,3])", 0, "not a JSON object");
  refused(R"({"a":)", 0, "invalid JSON");
}

TEST(Safetensors, HostileJson) {
  refused(std::string(100000, '[') + std::string(100000, ']'), 0, "nested deeper than");
  refused(R"({"a":{"dtype":"F32","shape":[1e999],"data_offsets":[0,4]}})", 4, "invalid JSON");
}

TEST(Safetensors, HostileFiles) {
  auto expect_open_fails = [](const std::string& path, const std::string& want) {
    try {
      SafetensorsFile::open(path);
      FAIL() << "opened " << path;
    } catch (const hpct::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_open_fails("/nonexistent/x.safetensors", "cannot open");
  // Header length beyond the file, and data past what the header accounts for.
  std::string p = ::testing::TempDir() + "/st_short_" + std::to_string(::getpid());
  g_cleanup.paths.push_back(p);
  {
    std::ofstream o(p, std::ios::binary);
    uint64_t hl = 1000;
    o.write(reinterpret_cast<const char*>(&hl), 8);
    o << "{}";
  }
  expect_open_fails(p, "header length 1000");
  expect_open_fails(file_with(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", {1.0f}, 4), "accounts for 4");
  expect_open_fails(file_with(R"(  {"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", {1.0f}), "does not start with '{'");
}

TEST(ParseJson, DepthAndNumbersNameTheSource) {
  EXPECT_NO_THROW(hpct::parse_json(std::string(60, '[') + std::string(60, ']'), "f.json"));
  for (const std::string& bad : {std::string(100000, '{'), std::string("{\"lr\": 1e999}"), std::string("{\"a\": }")}) {
    try {
      hpct::parse_json(bad, "f.json");
      FAIL() << "accepted " << bad.substr(0, 20);
    } catch (const hpct::Error& e) {
      EXPECT_NE(std::string(e.what()).find("f.json"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(hpct::json_excerpt(nlohmann::json(std::string(200, 'x')), 10), "\"xxxxxxxxx...");
}
