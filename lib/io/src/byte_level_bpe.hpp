// byte_level_bpe.hpp — private to lib/io: the byte-level BPE tables Gpt2Tokenizer encodes with, and
// what its two loaders share (gpt2_tokenizer.cpp: vocab.json + merges.txt; hf_tokenizer_json.cpp:
// a Hugging Face tokenizer.json).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <nlohmann/json.hpp>
#include <pcre2.h>

namespace hpct::io::detail {

// GPT-2's pre-tokenizer, verbatim from encoder.py. Under PCRE2_UCP, \s agrees with Python's `regex`
// module (the reference) on U+0085 and U+FEFF, where JavaScript ports such as gpt-3-encoder differ;
// the two may still disagree on characters newer than PCRE2's Unicode tables.
inline constexpr const char* kPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr const char* kEndOfText = "<|endoftext|>";
// Ids are array indices here, so a typo such as 5025600 must not allocate gigabytes.
inline constexpr int64_t kMaxId = int64_t{1} << 26;

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

// Merge table keyed by the id pair (left << 32 | right): open addressing with linear probing at a
// load factor <= 1/2. The hot loop of encode is this lookup, and std::unordered_map's node chasing
// costs about twice as much.
class MergeTable {
 public:
  struct Merge {
    int32_t rank;
    int32_t id;  // the id of the merged symbol
  };

  void build(const std::unordered_map<uint64_t, Merge>& merges) {
    size_t cap = 16;
    while (cap < 2 * merges.size()) cap *= 2;
    shift_ = 64;
    for (size_t c = cap; c > 1; c >>= 1) --shift_;
    slots_.assign(cap, Slot{kEmpty, {0, 0}});
    for (const auto& [key, merge] : merges) {
      size_t i = slot_of(key);
      while (slots_[i].key != kEmpty) i = (i + 1) & (cap - 1);
      slots_[i] = Slot{key, merge};
    }
  }

  const Merge* find(int32_t left, int32_t right) const {
    const uint64_t key = pack(left, right);
    const size_t mask = slots_.size() - 1;
    for (size_t i = slot_of(key);; i = (i + 1) & mask) {
      if (slots_[i].key == key) return &slots_[i].merge;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

  static uint64_t pack(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are < 2^26, so no real key is all ones
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  size_t slot_of(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<Slot> slots_;
  int shift_ = 60;
};

struct Gpt2TokenizerTables {
  std::vector<std::string> id_bytes;  // id -> the bytes it stands for
  std::vector<uint8_t> id_present;    // ids may have gaps in a hand-made vocab
  size_t vocab_size = 0;
  int32_t eod = -1;
  std::string eod_missing = std::string("the GPT-2 vocab has no end-of-document token ") + kEndOfText;
  std::array<int32_t, 256> byte_id{};  // the single-byte tokens BPE starts from
  MergeTable merges;
  std::unique_ptr<pcre2_code, CodeDeleter> regex;
  // tokenizer.json only
  std::vector<int32_t> prefix;                        // the template's ids before the text
  bool ignore_merges = false;                         // a piece in the vocab is one id, unmerged
  std::unordered_map<std::string, int32_t> whole;     // ignore_merges: the vocab's bytes -> id
  std::vector<std::pair<std::string, int32_t>> added;  // added tokens split out of the text, longest first
  std::array<uint8_t, 256> added_first{};             // bytes an added token starts with
  std::string description;
};

/// A token written in byte-level code points (UTF-8) as the bytes it stands for; false for a
/// character outside the alphabet (a special token of some other vocab) or broken UTF-8.
bool byte_level_to_bytes(std::string_view token, std::string& out);
std::string pcre2_message(int code);
/// Reads the vocab: token (written in byte-level code points) -> id, into t (id_bytes, byte_id,
/// vocab_size, eod for <|endoftext|>); returns bytes -> id for the merges. `what` names the vocab in
/// messages ("GPT-2 vocab", "tokenizer.json model.vocab").
std::unordered_map<std::string, int32_t> read_vocab(Gpt2TokenizerTables& t, const nlohmann::json& vocab,
                                                    const std::string& path, const std::string& what);
/// The pre-tokenizer regex, compiled (JIT where available) into t.regex; `where` names it in errors.
void compile_pre_tokenizer(Gpt2TokenizerTables& t, const std::string& pattern, const std::string& where);

// Adds one merge (rank = the order of the calls); `malformed` makes the error for a symbol or a
// result that is not in the vocab.
template <class Malformed>
void add_merge(std::unordered_map<uint64_t, MergeTable::Merge>& merges, const std::unordered_map<std::string, int32_t>& bytes_to_id,
               std::string_view left, std::string_view right, int32_t rank, const Malformed& malformed) {
  std::string left_bytes, right_bytes;
  std::array<int32_t, 3> ids{};  // left, right, merged
  for (int k = 0; k < 2; ++k) {
    std::string& b = k == 0 ? left_bytes : right_bytes;
    const std::string_view sym = k == 0 ? left : right;
    const auto it = byte_level_to_bytes(sym, b) ? bytes_to_id.find(b) : bytes_to_id.end();
    if (it == bytes_to_id.end()) throw malformed("symbol '" + std::string(sym) + "' is not in the vocab");
    ids[k] = it->second;
  }
  const auto merged = bytes_to_id.find(left_bytes + right_bytes);
  if (merged == bytes_to_id.end())
    throw malformed("merged symbol '" + std::string(left) + std::string(right) + "' is not in the vocab");
  ids[2] = merged->second;
  // A repeated pair takes its later rank, as dict(zip(merges, range(n))) does in encoder.py.
  merges[MergeTable::pack(ids[0], ids[1])] = MergeTable::Merge{rank, ids[2]};
}

}  // namespace hpct::io::detail
