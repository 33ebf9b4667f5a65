// Tokenizer identities of checkpoints (hpct/engine/tokenizer_identity.hpp).
#include "hpct/engine/tokenizer_identity.hpp"

#include <cstdint>
#include <cstdio>

#include "hpct/core/error.hpp"
#include "hpct/core/file.hpp"
#include "hpct/core/rng.hpp"
#include "hpct/io/gpt2_tokenizer.hpp"

namespace hpct::engine {

namespace {
std::string file_fingerprint(const std::string& path, const char* what) {
  try {
    return bytes_fingerprint(read_regular_file(path, what, io::Gpt2Tokenizer::kMaxFileBytes));
  } catch (const Error&) {
    return "unreadable";
  }
}
}  // namespace

std::string bytes_fingerprint(const std::string& bytes) {
  const uint64_t h = fnv1a64(bytes.data(), bytes.size(), kFnv1aBasis);
  char out[32];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

std::string tokenizer_identity(const std::string& vocab_file, const std::string& merge_file) {
  return "gpt2-bpe vocab:fnv1a64:" + file_fingerprint(vocab_file, "GPT-2 vocab file") +
         " merges:fnv1a64:" + file_fingerprint(merge_file, "GPT-2 merges file");
}

std::string stored_fingerprint(const std::string& identity, const std::string& which) {
  if (identity.rfind("gpt2-bpe ", 0) != 0) return "";
  const std::string key = " " + which + ":fnv1a64:";
  const auto at = identity.find(key);
  if (at == std::string::npos) return "";
  const auto begin = at + key.size();
  const auto end = identity.find(' ', begin);
  return identity.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

std::string tokenizer_file_problem(const std::string& identity, const std::string& which, const std::string& path,
                                   const std::string& bytes) {
  const std::string want = stored_fingerprint(identity, which);
  if (want.empty())
    return "the checkpoint stores no fingerprint of a GPT-2 " + which + " file to check " + path + " against (its tokenizer: " +
           identity + ")";
  const std::string got = bytes_fingerprint(bytes);
  if (got == want) return "";
  return path + " is not the " + which + " file the checkpoint was trained with (fnv1a64 " + got + "; the checkpoint has " +
         want + ")";
}

}  // namespace hpct::engine
