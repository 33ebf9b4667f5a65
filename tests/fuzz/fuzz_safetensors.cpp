// Fuzz target: the safetensors reader (hpct_ckpt import). Input = a whole file.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.hpp"
#include "hpct/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using hpct::io::SafetensorsFile;
  // The header rules on their own, against a data section as long as the input.
  hpct::fuzz::refusal_ok([&] { SafetensorsFile::parse_header(std::string(reinterpret_cast<const char*>(data), size), size, "in"); });
  // The whole file, then every tensor read at its own shape (F32) as import does.
  const std::string path = hpct::fuzz::write_file("in.safetensors", data, size);
  hpct::fuzz::refusal_ok([&] {
    auto f = SafetensorsFile::open(path);
    for (const auto& t : f.tensors())
      hpct::fuzz::refusal_ok([&] { f.read_f32(t.name, t.shape); });
  });
  return 0;
}
