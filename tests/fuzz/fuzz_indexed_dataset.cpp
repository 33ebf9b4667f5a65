// Fuzz target: Megatron's .idx/.bin reader (pretrain_gpt --data-path). Input = 4-byte length L,
// then L bytes of .idx, the rest .bin. Every document is read back in full.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>

#include "fuzz_util.hpp"
#include "hpct/io/indexed_dataset.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t n = 0;
  std::memcpy(&n, data, 4);
  n = static_cast<uint32_t>(std::min<size_t>(n, size - 4));
  hpct::fuzz::write_file("d.idx", data + 4, n);
  hpct::fuzz::write_file("d.bin", data + 4 + n, size - 4 - n);
  hpct::fuzz::refusal_ok([&] {
    auto ds = hpct::io::IndexedDataset::open(hpct::fuzz::scratch() + "/d");
    std::vector<int32_t> buf;
    for (size_t i = 0; i < ds.num_items() && i < 4096; ++i) {
      buf.resize(static_cast<size_t>(ds.sizes()[i]));
      ds.read(i, 0, buf.size(), buf.data());
    }
  });
  return 0;
}
