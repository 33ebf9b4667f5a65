// Fuzz target: ib_healthcheck's profile reader (inputs/healthcheck/*.json, or a user's file).
#include <cstddef>
#include <cstdint>

#include "fuzz_util.hpp"
#include "profile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hpct::fuzz::write_file("profile.json", data, size);
  hpct::fuzz::refusal_ok([&] { (void)hpct::healthcheck::load_profile(path); });
  return 0;
}
