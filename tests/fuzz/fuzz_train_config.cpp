// Fuzz target: Megatron flags and the ds_config (pretrain_gpt's whole configuration surface).
// Input = flags, one per line, up to a line "--"; the rest is the ds_config.json text. parse_args
// + finalize as pretrain_gpt runs them, at 1 to 4 data-parallel ranks.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "hpct/engine/config/train_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const size_t sep = text.find("\n--\n");
  std::vector<std::string> args;
  std::stringstream flags(text.substr(0, sep));
  for (std::string line; std::getline(flags, line);)
    if (!line.empty()) args.push_back(line);
  if (sep != std::string::npos) {
    const std::string body = text.substr(sep + 4);
    args.push_back("--deepspeed_config");
    args.push_back(hpct::fuzz::write_file("ds_config.json", reinterpret_cast<const uint8_t*>(body.data()), body.size()));
  }
  for (int dp = 1; dp <= 4; dp *= 2)
    hpct::fuzz::refusal_ok([&] {
      hpct::engine::TrainConfig c;
      if (!hpct::engine::parse_args(args, c)) return;  // --help
      c.finalize(dp);
      (void)hpct::engine::config_to_json(c).dump();
    });
  return 0;
}
