// cuDNN's fused attention graphs (lib/kernels/src/cuda/cudnn_attention.cpp) checked where there is
// no GPU. For a device described by cuDNN's device-properties JSON (an H100 SXM, an A100 SXM4 and a
// V100), cuDNN's heuristics must offer an engine for the forward and the backward graph, the engine
// must pass cuDNN's support checks, and the execution plan must be built as far as a machine without
// a GPU allows: cuDNN stops where it loads the compiled kernel through the driver, here the CUDA
// toolkit's stub libcuda (loaded first, so that cuDNN finds a libcuda.so.1 and reaches that step).
// What this catches: a graph cuDNN does not fuse (measured: keeping the probabilities in fp32 before
// P V, or the per-document mask as a LOGICAL_AND of two masks, gets no engine), a device it does not
// serve (sm70: none). What it cannot: whether the kernel
// computes the right values; test_ops_backend_cuda's FusedAttention* cases check that on a GPU.
// Skipped (and reported so) where libcudnn.so.9 or the stub is missing.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "hpct/kernels/cuda_ops.hpp"

using hpct::kernels::cuda::fused_attention_offline;

namespace {

// cudaDeviceProp-like fields cuDNN 9.19 reads (each one it asks for by name when missing);
// deviceVer is the compute capability as major*100 + minor*10.
std::string device(const char* name, int sms, int smem_optin, int ver) {
  return std::string(R"({"maxGridSize": [2147483647, 65535, 65535], "maxBlockSize": [1024, 1024, 64],
    "regsPerBlock": 65536, "multiProcessorCount": )") + std::to_string(sms) +
         R"(, "warpSize": 32, "maxSharedMemoryPerBlock": 49152, "maxSharedMemoryPerBlockOptin": )" +
         std::to_string(smem_optin) + R"(, "reservedSharedMemoryPerBlock": 1024, "maxRegistersPerSM": 65536,
    "maxCtasPerSM": 32, "maxThreadsPerBlock": 1024, "maxThreadsPerSM": 2048, "pciDeviceId": 0, "isTccDriver": 0,
    "supportCoopLaunch": 1, "smClockRateKHz": 1500000, "memClockRateKHz": 2000000, "l2CacheSize": 41943040,
    "deviceName": ")" + name + R"(", "totalGlobalMem": 85520809984, "cudaDeviceId": 0, "deviceVer": )" +
         std::to_string(ver) + R"(, "driverVer": 13000})";
}
const std::string kH100 = device("NVIDIA H100 80GB HBM3", 132, 232448, 900);
const std::string kA100 = device("NVIDIA A100-SXM4-80GB", 108, 166912, 800);
const std::string kV100 = device("Tesla V100-SXM2-32GB", 80, 98304, 700);

class Offline : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL)) GTEST_SKIP() << "libcudnn.so.9 cannot be loaded: " << dlerror();
    if (!dlopen(HPCT_CUDA_STUB, RTLD_NOW | RTLD_GLOBAL)) GTEST_SKIP() << "no CUDA driver stub at " << HPCT_CUDA_STUB;
  }
};

}  // namespace

// The shapes the gpu tests and the benchmarks run: test_ops_backend_cuda's three, test_gpt_cuda's
// tiny model (head size 8), GPT-2 124M and 350M (head size 64), 1.3B (128); bf16, and fp16 at
// head sizes 32 and 128, on the H100 (each pair of plans takes cuDNN about 0.7 s here).
TEST_F(Offline, GraphsBuildForTheShapesWeRun) {
  struct Shape {
    int B, T, NH, HS;
  };
  for (const Shape& s : {Shape{2, 128, 2, 64}, Shape{1, 100, 3, 32}, Shape{2, 256, 4, 128}, Shape{3, 16, 4, 8},
                         Shape{8, 1024, 12, 64}, Shape{8, 1024, 16, 64}, Shape{4, 1024, 16, 128}})
    for (bool fp16 : {false, true})
      if (!fp16 || s.HS == 32 || s.HS == 128)  // fp16 at the gpu tests' fp16 head sizes
        EXPECT_EQ(fused_attention_offline(s.B, s.T, s.NH, s.HS, fp16, 0, false, kH100), "")
            << "B=" << s.B << " T=" << s.T << " heads " << s.NH << " x " << s.HS << (fp16 ? " fp16" : " bf16");
  // Attention dropout (cuDNN's generator in both graphs): GPT-2 124M's shape and a small fp16 one.
  EXPECT_EQ(fused_attention_offline(8, 1024, 12, 64, false, 0.1f, false, kH100), "");
  EXPECT_EQ(fused_attention_offline(1, 100, 3, 32, true, 0.25f, false, kH100), "");
  // Per-document masks (each query's first key, int32), alone and with dropout.
  EXPECT_EQ(fused_attention_offline(2, 128, 2, 64, false, 0, true, kH100), "");
  EXPECT_EQ(fused_attention_offline(8, 1024, 12, 64, false, 0.1f, true, kH100), "");
  // The gpu tests' other variants: FusedAttentionDropout's, the tiny model's dropout and documents.
  EXPECT_EQ(fused_attention_offline(2, 128, 2, 128, true, 0.25f, false, kH100), "");
  EXPECT_EQ(fused_attention_offline(3, 16, 4, 8, false, 0.2f, false, kH100), "");
  EXPECT_EQ(fused_attention_offline(3, 16, 4, 8, false, 0, true, kH100), "");
  // An A100 (Ampere: head sizes up to 128 in the backward) at GPT-2's and 1.3B's shapes.
  EXPECT_EQ(fused_attention_offline(8, 1024, 12, 64, false, 0, false, kA100), "");
  EXPECT_EQ(fused_attention_offline(4, 1024, 16, 128, false, 0, false, kA100), "");
}

// Flash attention needs compute capability 8.0: cuDNN offers no engine for a V100.
TEST_F(Offline, NoEngineBeforeAmpere) {
  const std::string why = fused_attention_offline(2, 64, 2, 64, false, 0, false, kV100);
  EXPECT_NE(why.find("no engine for the forward graph"), std::string::npos) << why;
}

// A malformed description is cuDNN's error, named, not a crash.
TEST_F(Offline, ABadDeviceDescriptionIsNamed) {
  const std::string why = fused_attention_offline(2, 64, 2, 64, false, 0, false, "{}");
  EXPECT_NE(why.find("the device's properties"), std::string::npos) << why;
}
