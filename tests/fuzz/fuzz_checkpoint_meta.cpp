// Fuzz target: a checkpoint's run-state attributes and its `latest` pointer (pretrain_gpt --load,
// hpct_ckpt verify). Input = lines "key=value": string attributes as given, "iteration" and the
// other integers parsed as int64 ("seed" and "run_state_checksum" as uint64); a line "latest=..."
// is written to a directory's `latest`, which resolve() then follows. The run state goes through
// every check load runs, and then is compared with a fixed run (architecture, tokenizer, seed).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

#include "fuzz_util.hpp"
#include "hpct/engine/checkpoint/checkpoint_state.hpp"
#include "hpct/engine/checkpoint/checkpointer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> kv;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) {
    auto eq = line.find('=');
    if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  hpct::engine::RunStateAttrs a;
  a.str = [&](const char* k) -> std::optional<std::string> {
    auto it = kv.find(k);
    return it == kv.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  a.i64 = [&](const char* k) -> std::optional<int64_t> {
    auto it = kv.find(k);
    return it == kv.end() ? std::nullopt : std::optional<int64_t>(std::strtoll(it->second.c_str(), nullptr, 10));
  };
  a.u64 = [&](const char* k) -> std::optional<uint64_t> {
    auto it = kv.find(k);
    return it == kv.end() ? std::nullopt : std::optional<uint64_t>(std::strtoull(it->second.c_str(), nullptr, 10));
  };
  hpct::fuzz::refusal_ok([&] {
    auto r = hpct::engine::parse_stored_run(a, "ckpt.h5");
    hpct::engine::CheckpointMeta here;
    here.architecture = {{"model", "gpt"}, {"num_layers", 2}, {"hidden_size", 64}, {"num_attention_heads", 4},
                         {"seq_length", 32}, {"padded_vocab_size", 128}};
    here.tokenizer = "mock (vocab 100)";
    here.seed = 1234;
    hpct::engine::check_compatible(r, here, "ckpt.h5");
    hpct::model::Gpt gpt(hpct::engine::gpt_config_of(r.meta.architecture, "ckpt.h5"), hpct::kernels::Precision::fp32, false);
  });
  if (auto it = kv.find("latest"); it != kv.end()) {
    const std::string dir = hpct::fuzz::scratch() + "/ckdir";
    static bool made = [&] { return std::system(("mkdir -p '" + dir + "' && touch '" + dir + "/iter_0000002.h5'").c_str()) == 0; }();
    (void)made;
    hpct::fuzz::write_file("ckdir/latest", reinterpret_cast<const uint8_t*>(it->second.data()), it->second.size());
    hpct::fuzz::refusal_ok([&] { hpct::engine::Checkpointer::resolve(dir); });
  }
  return 0;
}
