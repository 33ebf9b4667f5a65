// Fuzz target: response files (@FILE), as every app reads its flags file. Input = the file's bytes;
// the command line is "@FILE", expanded and parsed as pretrain_gpt's flags, then finalized at one
// rank (fuzz_train_config covers the rank counts; a finalize costs ~30 ms under ASan). A directory,
// device or FIFO as FILE is refused before any read: core/file.hpp, test_file.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "hpct/engine/config/train_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> args = {"@" + hpct::fuzz::write_file("flags.args", data, size)};
  hpct::fuzz::refusal_ok([&] {
    hpct::engine::TrainConfig c;
    if (!hpct::engine::parse_args(args, c)) return;  // --help
    c.finalize(1);
    (void)hpct::engine::config_to_json(c).dump();
  });
  return 0;
}
