// tokenizer_test_dirs.hpp — where the tokenizer tests find the GPT-2 files and the sources: the
// HPCT_DATA_DIR / HPCT_SOURCE_DIR environment CTest sets, else the directories CMake compiled in
// (HPCT_TEST_DATA_DIR, HPCT_TEST_SOURCE_DIR) for running a binary by hand.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace hpct::test {

inline std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}
inline std::filesystem::path data_dir() { return env_or("HPCT_DATA_DIR", HPCT_TEST_DATA_DIR); }
inline std::filesystem::path source_dir() { return env_or("HPCT_SOURCE_DIR", HPCT_TEST_SOURCE_DIR); }

}  // namespace hpct::test
