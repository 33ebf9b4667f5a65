// Tokenizer identities of checkpoints (hpct/engine/checkpoint/tokenizer_identity.hpp).
#include "hpct/engine/checkpoint/tokenizer_identity.hpp"

#include <cstdint>
#include <cstdio>

#include "hpct/core/error.hpp"
#include "hpct/core/file.hpp"
#include "hpct/core/rng.hpp"

namespace hpct::engine {

namespace {
std::string file_fingerprint(const std::string& path, const std::string& what) {
  try {
    return bytes_fingerprint(read_regular_file(path, what, io::kMaxTokenizerFileBytes));
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

std::string tokenizer_identity(const io::TokenizerSpec& spec) {
  // GPT-2's identity keeps the form checkpoints have always stored
  std::string id = spec.type == "GPT2BPETokenizer" ? "gpt2-bpe" : spec.type;
  for (const auto& [role, path] : io::tokenizer_files(spec))
    id += " " + role + ":fnv1a64:" + file_fingerprint(path, spec.type + " " + role + " file");
  return id;
}

io::TokenizerSpec stored_tokenizer_spec(const nlohmann::json& c) {
  io::TokenizerSpec s;
  auto str = [&](const char* key, std::string& out) {
    if (c.is_object() && c.contains(key) && c[key].is_string()) out = c[key].get<std::string>();
  };
  str("tokenizer_type", s.type);
  str("tokenizer_model", s.model);
  str("vocab_file", s.vocab_file);
  str("merge_file", s.merge_file);
  return s;
}

std::string stored_fingerprint(const std::string& identity, const std::string& which) {
  if (identity.rfind("mock", 0) == 0 || identity.rfind("unknown", 0) == 0) return "";
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
    return "the checkpoint stores no fingerprint of a tokenizer " + which + " file to check " + path +
           " against (its tokenizer: " + identity + ")";
  const std::string got = bytes_fingerprint(bytes);
  if (got == want) return "";
  return path + " is not the " + which + " file the checkpoint was trained with (fnv1a64 " + got + "; the checkpoint has " +
         want + ")";
}

std::shared_ptr<const io::Tokenizer> open_checked_tokenizer(const io::TokenizerSpec& spec, const std::string& identity,
                                                            const std::string& file) {
  io::check_tokenizer_spec(spec);
  // Regular files of bounded size only (a FIFO or /dev/zero would block or stream forever), holding
  // the bytes the run was trained with; an identity without fingerprints ("hf": a Hugging Face
  // directory's own files) checks nothing.
  if (identity != "hf")
    for (const auto& [role, path] : io::tokenizer_files(spec)) {
      const std::string flag = role == "vocab" ? "--vocab-file" : role == "merges" ? "--merge-file" : "--tokenizer-model";
      const std::string bytes = read_regular_file(path, spec.type + " " + role + " file", io::kMaxTokenizerFileBytes,
                                                  "give " + flag);
      if (const std::string why = tokenizer_file_problem(identity, role, path, bytes); !why.empty())
        throw config_error(flag, why + " (checkpoint " + file + ")", "give " + flag + " with the run's file");
    }
  return io::open_tokenizer(spec);
}

}  // namespace hpct::engine
