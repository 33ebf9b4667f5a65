// Shared by the fuzz targets (tests/fuzz): a scratch directory per process, and the rule that an
// input may be refused only with hpct::Error. Any other exception, a crash, a leak or a sanitizer
// report is a find.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "hpct/core/error.hpp"

namespace hpct::fuzz {

inline const std::string& scratch() {
  static const std::string d = [] {
    std::string base = std::getenv("HPCT_FUZZ_SCRATCH") ? std::getenv("HPCT_FUZZ_SCRATCH") : "/tmp";
    std::string p = base + "/hpct_fuzz." + std::to_string(::getpid());
    std::string cmd = "mkdir -p '" + p + "'";
    if (std::system(cmd.c_str()) != 0) std::abort();
    return p;
  }();
  return d;
}

inline std::string write_file(const std::string& name, const uint8_t* data, size_t size) {
  std::string p = scratch() + "/" + name;
  std::ofstream o(p, std::ios::binary | std::ios::trunc);
  o.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return p;
}

/// Runs f; hpct::Error is a clean refusal, anything else escapes to libFuzzer as a find.
template <class F>
void refusal_ok(F&& f) {
  try {
    f();
  } catch (const hpct::Error&) {
  }
}

}  // namespace hpct::fuzz
