// GPT-2 byte-level BPE: loading the vocab/merges files, pre-tokenizing with PCRE2, merging by rank.
//
// It is: a port of OpenAI's gpt-2 encoder.py (bytes_to_unicode, the pre-tokenizer regex, bpe()),
// checked id for id against it in tests/tokenizer. It is not: a trainer of merges, nor a place for
// other tokenizers' rules (SentencePiece, tiktoken's cl100k regex).
// Trade-off: the reference re-scans every pair of a word after each merge (quadratic in the word's
// length); here a word is a linked list of symbols with a heap of candidate merges ordered by
// (rank, position), O(n log n). That gives the same result as long as a merge's inputs never
// have a higher rank than the merge itself, which holds for any merges file produced by BPE
// training (each symbol is made before it is used), GPT-2's included.
#include "hpct/io/gpt2_tokenizer.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <unordered_map>
#include <utility>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <nlohmann/json.hpp>
#include <pcre2.h>

#include "hpct/core/error.hpp"
#include "hpct/core/file.hpp"

namespace hpct::io {
namespace detail {
namespace {

// GPT-2's pre-tokenizer, verbatim from encoder.py. Under PCRE2_UCP, \s agrees with Python's `regex`
// module (the reference) on U+0085 and U+FEFF, where JavaScript ports such as gpt-3-encoder differ;
// the two may still disagree on characters newer than PCRE2's Unicode tables.
constexpr const char* kPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kEndOfText = "<|endoftext|>";
constexpr const char* kFetchHint = "scripts/fetch_tokenizer.sh fetches GPT-2's gpt2-vocab.json and gpt2-merges.txt";
constexpr const char* kPairHint = "the merges file must belong to the same tokenizer as the vocab file";
// Ids are array indices here, so a typo such as 5025600 must not allocate gigabytes.
constexpr int64_t kMaxId = int64_t{1} << 26;

// bytes_to_unicode() from encoder.py: printable Latin-1 bytes stand for themselves, the other 68
// (controls, space, 0x7F-0xA0, soft hyphen) are moved to U+0100.. so that no token contains
// whitespace or control characters. Only the inverse is needed: the vocab and merges files are
// written in these code points, and we work on the raw bytes they stand for.
struct ByteLevelAlphabet {
  static constexpr int kCodePoints = 256 + 68;
  std::array<int16_t, kCodePoints> byte_of{};  // code point -> byte, -1 for none
  constexpr ByteLevelAlphabet() {
    for (auto& b : byte_of) b = -1;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_of[printable ? b : 256 + n++] = static_cast<int16_t>(b);
    }
  }
};
constexpr ByteLevelAlphabet kAlphabet;  // constexpr: no static-initialisation order to worry about

// Converts a token written in byte-level code points (UTF-8) to the bytes it stands for. False if a
// character is outside the alphabet (a special token of some other vocab) or the UTF-8 is broken.
bool byte_level_to_bytes(std::string_view token, std::string& out) {
  out.clear();
  for (size_t i = 0; i < token.size();) {
    const auto c = static_cast<unsigned char>(token[i]);
    const auto c1 = i + 1 < token.size() ? static_cast<unsigned char>(token[i + 1]) : 0u;
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && (c1 & 0xC0) == 0x80) {
      cp = ((c & 0x1Fu) << 6) | (c1 & 0x3Fu);
      i += 2;
    } else {
      return false;  // 3- and 4-byte characters are all above U+0143, the alphabet's last
    }
    if (cp >= ByteLevelAlphabet::kCodePoints || kAlphabet.byte_of[cp] < 0) return false;
    out.push_back(static_cast<char>(kAlphabet.byte_of[cp]));
  }
  return true;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

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

namespace {

// One symbol of a word being merged; words are doubly linked lists so a merge is O(1).
struct Symbol {
  int32_t id;  // -1 once merged into its left neighbour
  int32_t prev;
  int32_t next;  // -1 at either end
};

// A merge that was possible when pushed. It is stale (and skipped) if either side has changed
// since, which is detected by the ids: a merged symbol always gets a new, longer id.
struct Candidate {
  int32_t rank;
  int32_t left;
  int32_t right;
  int32_t left_id;
  int32_t right_id;
  int32_t merged_id;
};

// Lowest rank first; among equal ranks the leftmost, as the reference merges left to right.
struct LaterCandidate {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  }
};

// Per-call working memory, reused across the pieces of one encode call.
struct Scratch {
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

void push_candidate(const Gpt2TokenizerTables& t, Scratch& s, int32_t left, int32_t right) {
  const int32_t a = s.symbols[left].id;
  const int32_t b = s.symbols[right].id;
  if (const MergeTable::Merge* m = t.merges.find(a, b)) {
    s.heap.push_back(Candidate{m->rank, left, right, a, b, m->id});
    std::push_heap(s.heap.begin(), s.heap.end(), LaterCandidate{});
  }
}

// encoder.py's bpe() on one pre-tokenized piece, appending its ids to out.
void bpe_piece(const Gpt2TokenizerTables& t, Scratch& s, std::string_view piece, std::vector<int32_t>& out) {
  const auto n = static_cast<int32_t>(piece.size());
  if (n == 1) {
    out.push_back(t.byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  s.symbols.resize(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    s.symbols[i] = Symbol{t.byte_id[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  s.heap.clear();
  for (int32_t i = 0; i + 1 < n; ++i) push_candidate(t, s, i, i + 1);

  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), LaterCandidate{});
    const Candidate c = s.heap.back();
    s.heap.pop_back();
    Symbol& l = s.symbols[c.left];
    if (l.id != c.left_id || l.next != c.right || s.symbols[c.right].id != c.right_id) continue;  // stale
    l.id = c.merged_id;
    l.next = s.symbols[c.right].next;
    if (l.next >= 0) s.symbols[l.next].prev = c.left;
    s.symbols[c.right].id = -1;
    if (l.prev >= 0) push_candidate(t, s, l.prev, c.left);
    if (l.next >= 0) push_candidate(t, s, c.left, l.next);
  }
  // Symbol 0 is never merged away (merges keep the left index), so it heads the list.
  for (int32_t i = 0; i >= 0; i = s.symbols[i].next) out.push_back(s.symbols[i].id);
}

}  // namespace
}  // namespace detail

Gpt2Tokenizer::Gpt2Tokenizer(std::shared_ptr<const detail::Gpt2TokenizerTables> tables) : tables_(std::move(tables)) {}

namespace detail {
namespace {

// Reads the vocab: token (written in byte-level code points) -> id. `what` names the vocab in
// messages ("GPT-2 vocab", "tokenizer.json model.vocab").
std::unordered_map<std::string, int32_t> read_vocab(Gpt2TokenizerTables& t, const nlohmann::json& vocab,
                                                    const std::string& path, const std::string& what) {
  std::unordered_map<std::string, int32_t> bytes_to_id;  // only needed to resolve the merges
  bytes_to_id.reserve(vocab.size());
  std::string bytes;
  for (const auto& [token, value] : vocab.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= kMaxId) {
      throw file_error(path, what + " entry '" + token + "' has id " + value.dump() + ", expected an integer in [0, " +
                                 std::to_string(kMaxId) + ")");
    }
    const auto id = static_cast<int32_t>(value.get<int64_t>());
    if (static_cast<size_t>(id) >= t.id_bytes.size()) {
      t.id_bytes.resize(static_cast<size_t>(id) + 1);
      t.id_present.resize(static_cast<size_t>(id) + 1, 0);
    }
    if (t.id_present[id]) throw file_error(path, what + " uses id " + std::to_string(id) + " twice (again for '" + token + "')");
    t.id_present[id] = 1;
    if (byte_level_to_bytes(token, bytes)) {
      bytes_to_id.emplace(bytes, id);
      t.id_bytes[id] = bytes;
    } else {
      t.id_bytes[id] = token;  // a special token outside the byte alphabet decodes to its text
    }
    if (token == kEndOfText) t.eod = id;
  }
  t.vocab_size = vocab.size();
  for (int b = 0; b < 256; ++b) {
    const auto it = bytes_to_id.find(std::string(1, static_cast<char>(b)));
    if (it == bytes_to_id.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      throw file_error(path, what + " has no token for byte " + hex, "a byte-level BPE vocab holds all 256 single-byte tokens");
    }
    t.byte_id[b] = it->second;
  }
  return bytes_to_id;
}

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

// PCRE2_MATCH_INVALID_UTF lets the matcher step over bytes that are not UTF-8 instead of failing
// the whole text; encode() turns what it stepped over into pieces of their own.
void compile_pre_tokenizer(Gpt2TokenizerTables& t, const std::string& pattern, const std::string& where) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  t.regex.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr));
  if (!t.regex) throw Error("cannot compile the pre-tokenizer regex of " + where + ": " + pcre2_message(err));
  // JIT is ~5x faster than the interpreter; where it is unavailable pcre2_match falls back by itself.
  (void)pcre2_jit_compile(t.regex.get(), PCRE2_JIT_COMPLETE);
}

}  // namespace
}  // namespace detail

Gpt2Tokenizer Gpt2Tokenizer::from_files(const std::string& vocab_path, const std::string& merges_path) {
  using namespace detail;
  auto t = std::make_shared<Gpt2TokenizerTables>();

  // --- vocab: {"token": id}, tokens written in byte-level code points ---
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(read_regular_file(vocab_path, "GPT-2 vocab file", Gpt2Tokenizer::kMaxFileBytes, kFetchHint));
  } catch (const nlohmann::json::exception& e) {
    throw file_error(vocab_path, std::string("invalid JSON in GPT-2 vocab file: ") + e.what(), kFetchHint);
  }
  if (!vocab.is_object() || vocab.empty()) {
    throw file_error(vocab_path, "GPT-2 vocab file must be a non-empty JSON object {\"token\": id, ...}", kFetchHint);
  }
  const auto bytes_to_id = read_vocab(*t, vocab, vocab_path, "GPT-2 vocab");
  vocab = nullptr;  // the parsed JSON is several times the file's size; free it before the merges

  // --- merges: optional "#version" line, then "left right" per line, rank = order ---
  const std::string text = read_regular_file(merges_path, "GPT-2 merges file", Gpt2Tokenizer::kMaxFileBytes, kFetchHint);
  std::unordered_map<uint64_t, MergeTable::Merge> merges;
  merges.reserve(t->vocab_size);
  int32_t rank = 0;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_no == 1 && line.substr(0, 8) == "#version") continue;
    std::vector<std::string_view> fields;
    for (size_t i = 0; i < line.size();) {
      if (line[i] == ' ' || line[i] == '\t') {
        ++i;
        continue;
      }
      const size_t j = std::min(line.find_first_of(" \t", i), line.size());
      fields.push_back(line.substr(i, j - i));
      i = j;
    }
    if (fields.empty()) continue;  // blank lines, such as the one after the final newline
    auto malformed = [&](const std::string& what) {
      return file_error(merges_path, "malformed GPT-2 merges file, line " + std::to_string(line_no) + ": " + what,
                        kPairHint);
    };
    if (fields.size() != 2) {
      throw malformed("expected two symbols separated by a space, got '" + std::string(line) + "'");
    }
    add_merge(merges, bytes_to_id, fields[0], fields[1], rank++, malformed);
  }
  t->merges.build(merges);
  compile_pre_tokenizer(*t, kPattern, "GPT-2");
  t->description = "GPT2BPETokenizer " + vocab_path + " + " + merges_path;
  return Gpt2Tokenizer(std::move(t));
}

namespace detail {
namespace {

std::string json_type(const nlohmann::json& j, const char* key = "type") {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string(j.dump());
}

// The pre-tokenizer's regex: ByteLevel's own (GPT-2's) or a Split regex before a regex-less ByteLevel.
std::string pre_tokenizer_pattern(const nlohmann::json& pre, const std::function<Error(const std::string&)>& refuse) {
  auto byte_level = [&](const nlohmann::json& b, bool regex) {
    if (b.value("add_prefix_space", false)) refuse("pre_tokenizer ByteLevel with add_prefix_space: true is not implemented");
    if (b.value("use_regex", true) != regex)
      refuse(regex ? "pre_tokenizer ByteLevel without its regex is implemented only after a Split"
                   : "pre_tokenizer ByteLevel after a Split must have use_regex: false");
  };
  if (json_type(pre) == "ByteLevel") {
    byte_level(pre, true);
    return kPattern;
  }
  if (json_type(pre) == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array() &&
      pre["pretokenizers"].size() == 2) {
    const auto& split = pre["pretokenizers"][0];
    const auto& bl = pre["pretokenizers"][1];
    if (json_type(split) == "Split" && json_type(bl) == "ByteLevel") {
      if (!split.contains("pattern") || !split["pattern"].is_object() || !split["pattern"].contains("Regex") ||
          !split["pattern"]["Regex"].is_string())
        refuse("pre_tokenizer Split with a pattern other than {\"Regex\": ...} is not implemented");
      if (split.value("behavior", std::string()) != "Isolated" || split.value("invert", false))
        refuse("pre_tokenizer Split with behavior '" + split.value("behavior", std::string("?")) +
               "' (or invert) is not implemented (only Isolated)");
      byte_level(bl, false);
      return split["pattern"]["Regex"].get<std::string>();
    }
  }
  refuse("pre_tokenizer " + json_type(pre) +
         " is not implemented (byte-level BPE: ByteLevel, or Split then ByteLevel; a SentencePiece-style file "
         "has tokenizer.model beside it for --tokenizer-type GPTSentencePieceTokenizer)");
  return {};
}

// The ids a TemplateProcessing post-processor puts before a single text; nothing after it.
void template_prefix(const nlohmann::json& post, std::vector<int32_t>& prefix,
                     const std::function<Error(const std::string&)>& refuse) {
  const std::string type = post.is_null() ? "null" : json_type(post);
  if (type == "null" || type == "ByteLevel") return;
  if (type == "Sequence" && post.contains("processors") && post["processors"].is_array()) {
    for (const auto& p : post["processors"]) template_prefix(p, prefix, refuse);
    return;
  }
  if (type != "TemplateProcessing" || !post.contains("single") || !post["single"].is_array())
    refuse("post_processor " + type + " is not implemented (TemplateProcessing, ByteLevel)");
  bool after = false;
  for (const auto& item : post["single"]) {
    if (item.contains("Sequence")) {
      after = true;
      continue;
    }
    const auto& st = item.contains("SpecialToken") ? item["SpecialToken"] : nlohmann::json();
    if (!st.is_object() || !st.contains("id") || !st["id"].is_string()) refuse("post_processor template item " + item.dump() + " is not understood");
    if (after) refuse("post_processor template adds '" + st["id"].get<std::string>() + "' after the text: not implemented");
    const auto& sp = post.contains("special_tokens") ? post["special_tokens"] : nlohmann::json();
    const std::string name = st["id"].get<std::string>();
    if (!sp.is_object() || !sp.contains(name) || !sp[name].contains("ids") || !sp[name]["ids"].is_array())
      refuse("post_processor template names '" + name + "', which its special_tokens do not define");
    for (const auto& id : sp[name]["ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxId)
        refuse("post_processor special token '" + name + "' has id " + id.dump());
      prefix.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
}

}  // namespace
}  // namespace detail

Gpt2Tokenizer Gpt2Tokenizer::from_hf_json(const std::string& path, const std::string& config_path) {
  // A key of an unexpected type (say "lstrip": "yes") makes nlohmann's accessors throw: one line
  // naming the file, as every other problem.
  try {
    return from_hf_json_checked(path, config_path);
  } catch (const nlohmann::json::exception& e) {
    throw file_error(path, std::string("unexpected JSON in a tokenizer file: ") + e.what(),
                     "Megatron's HFTokenizer reads a Hugging Face tokenizer.json of byte-level BPE (GPT-2, Llama 3)");
  }
}

Gpt2Tokenizer Gpt2Tokenizer::from_hf_json_checked(const std::string& path, const std::string& config_path) {
  using namespace detail;
  const char* hint = "Megatron's HFTokenizer reads a Hugging Face tokenizer.json of byte-level BPE (GPT-2, Llama 3)";
  std::function<Error(const std::string&)> refuse = [&](const std::string& why) -> Error {
    throw file_error(path, why, hint);
  };
  auto t = std::make_shared<Gpt2TokenizerTables>();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_regular_file(path, "tokenizer.json", kMaxTokenizerFileBytes, hint));
  } catch (const nlohmann::json::exception& e) {
    throw file_error(path, std::string("invalid JSON in tokenizer.json: ") + e.what(), hint);
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) refuse("has no \"model\" object");
  const auto& m = j["model"];
  if (json_type(m) != "BPE") refuse("model type " + json_type(m) + " is not byte-level BPE");
  if (j.contains("normalizer") && !j["normalizer"].is_null()) refuse("normalizer " + json_type(j["normalizer"]) + " is not implemented");
  if (m.value("byte_fallback", false)) refuse("model.byte_fallback: true (a SentencePiece-style BPE) is not implemented");
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"] != 0) refuse("model.dropout " + m["dropout"].dump() + " is not implemented");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && m[k] != "") refuse(std::string("model.") + k + " " + m[k].dump() + " is not implemented");
  if (j.contains("decoder") && !j["decoder"].is_null() && json_type(j["decoder"]) != "ByteLevel")
    refuse("decoder " + json_type(j["decoder"]) + " is not implemented (ByteLevel)");
  const std::string pattern = pre_tokenizer_pattern(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json(), refuse);
  template_prefix(j.contains("post_processor") ? j["post_processor"] : nlohmann::json(), t->prefix, refuse);
  t->ignore_merges = m.value("ignore_merges", false);

  if (!m.contains("vocab") || !m["vocab"].is_object() || m["vocab"].empty()) refuse("model.vocab must be a non-empty object");
  auto bytes_to_id = read_vocab(*t, m["vocab"], path, "tokenizer.json model.vocab");
  std::unordered_map<uint64_t, MergeTable::Merge> merges;
  if (!m.contains("merges") || !m["merges"].is_array()) refuse("model.merges must be a list");
  int32_t rank = 0;
  for (const auto& mg : m["merges"]) {
    auto malformed = [&](const std::string& what) {
      return file_error(path, "model.merges[" + std::to_string(rank) + "]: " + what, hint);
    };
    std::string left, right;
    if (mg.is_string()) {  // "a b" (tokenizers before 0.20)
      const std::string s = mg.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        throw malformed("expected two symbols separated by a space, got '" + s + "'");
      left = s.substr(0, sp), right = s.substr(sp + 1);
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {  // ["a", "b"]
      left = mg[0].get<std::string>(), right = mg[1].get<std::string>();
    } else {
      throw malformed("expected \"a b\" or [\"a\", \"b\"], got " + mg.dump());
    }
    add_merge(merges, bytes_to_id, left, right, rank++, malformed);
  }
  t->merges.build(merges);

  // Added tokens: ids of their own (or the vocab's), split out of the text before the pre-tokenizer.
  std::unordered_map<std::string, int32_t> added_ids;
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string() || !a.contains("id") ||
          !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() >= kMaxId)
        refuse("added_tokens entry " + a.dump() + " needs a string \"content\" and an id in [0, 2^26)");
      const std::string content = a["content"].get<std::string>();
      for (const char* k : {"lstrip", "rstrip", "single_word"})
        if (a.value(k, false)) refuse("added token '" + content + "' has " + k + ": true, which is not implemented");
      if (content.empty()) refuse("added_tokens has an empty token");
      const auto id = static_cast<int32_t>(a["id"].get<int64_t>());
      if (static_cast<size_t>(id) >= t->id_bytes.size()) {
        t->id_bytes.resize(static_cast<size_t>(id) + 1);
        t->id_present.resize(static_cast<size_t>(id) + 1, 0);
      }
      if (!t->id_present[id]) t->id_bytes[id] = content, t->id_present[id] = 1;
      added_ids[content] = id;
      t->added.emplace_back(content, id);
      t->added_first[static_cast<unsigned char>(content[0])] = 1;
    }
  std::sort(t->added.begin(), t->added.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  t->vocab_size = t->id_bytes.size();  // the largest id + 1: the model needs a row for each
  for (const int32_t id : t->prefix)
    if (static_cast<size_t>(id) >= t->vocab_size) refuse("post_processor template id " + std::to_string(id) + " is outside the vocab");
  if (t->ignore_merges) t->whole = bytes_to_id;
  bytes_to_id.clear();

  // The end-of-document id: tokenizer_config.json's eos_token, else a conventional name.
  auto id_of = [&](const std::string& token) -> int32_t {
    if (auto it = added_ids.find(token); it != added_ids.end()) return it->second;
    if (m["vocab"].contains(token) && m["vocab"][token].is_number_integer()) return m["vocab"][token].get<int32_t>();
    return -1;
  };
  std::string eos;
  if (!config_path.empty() && std::filesystem::exists(config_path)) {
    nlohmann::json c;
    try {
      c = nlohmann::json::parse(read_regular_file(config_path, "tokenizer_config.json", kMaxTokenizerFileBytes));
    } catch (const nlohmann::json::exception& e) {
      throw file_error(config_path, std::string("invalid JSON: ") + e.what());
    }
    if (c.is_object() && c.contains("eos_token")) {
      const auto& e = c["eos_token"];
      if (e.is_string()) eos = e.get<std::string>();
      else if (e.is_object() && e.contains("content") && e["content"].is_string()) eos = e["content"].get<std::string>();
    }
    if (!eos.empty() && (t->eod = id_of(eos)) < 0)
      throw file_error(config_path, "eos_token '" + eos + "' is not a token of " + path);
  }
  if (eos.empty())
    for (const char* name : {kEndOfText, "<|end_of_text|>", "</s>"})
      if ((t->eod = id_of(name)) >= 0) break;
  t->eod_missing = path + " names no end-of-document token (no eos_token in a tokenizer_config.json beside it, and no "
                          "<|endoftext|>, <|end_of_text|> or </s>)";
  compile_pre_tokenizer(*t, pattern, path);
  t->description = "HFTokenizer " + path;
  return Gpt2Tokenizer(std::move(t));
}

namespace detail {
namespace {

// Pre-tokenizes a text without added tokens and appends each piece's BPE ids.
void encode_plain(const Gpt2TokenizerTables& t, std::string_view text, std::vector<int32_t>& out) {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create_from_pattern(t.regex.get(), nullptr));
  if (!md) throw std::bad_alloc();
  Scratch scratch;
  // Piece -> where its ids first went in out. Text is Zipfian, so most pieces repeat; keying on
  // views into text and pointing into out costs no copies. Per call, so no locking is needed.
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> cache;

  auto emit = [&](std::string_view piece) {
    if (piece.size() == 1) {
      out.push_back(t.byte_id[static_cast<unsigned char>(piece[0])]);
      return;
    }
    const auto [it, fresh] = cache.try_emplace(piece, out.size(), 0);
    if (!fresh) {
      const auto [first, count] = it->second;
      for (size_t k = 0; k < count; ++k) {
        const int32_t id = out[first + k];  // copied first: push_back may reallocate
        out.push_back(id);
      }
      return;
    }
    const auto whole = t.ignore_merges ? t.whole.find(std::string(piece)) : t.whole.end();
    if (whole != t.whole.end()) out.push_back(whole->second);
    else bpe_piece(t, scratch, piece, out);
    it->second.second = out.size() - it->second.first;
  };

  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(t.regex.get(), subject, text.size(), pos, 0, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw Error("the pre-tokenizer failed at byte " + std::to_string(pos) + ": " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    // What no match covers is a piece of its own (Split's Isolated behaviour); with GPT-2's pattern
    // every valid character matches, so a gap is exactly a run of invalid UTF-8.
    if (ov[0] > pos) emit(text.substr(pos, ov[0] - pos));
    if (ov[1] == ov[0]) {  // an empty match (a pattern that allows one): step over one byte
      pos = ov[0];
      const size_t next = std::min(text.size(), pos + 1);
      emit(text.substr(pos, next - pos));
      pos = next;
      continue;
    }
    emit(text.substr(ov[0], ov[1] - ov[0]));
    pos = ov[1];
  }
  if (pos < text.size()) emit(text.substr(pos));
}

}  // namespace
}  // namespace detail

void Gpt2Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  const detail::Gpt2TokenizerTables& t = *tables_;
  if (t.added.empty()) return detail::encode_plain(t, text, out);
  // Added tokens first, leftmost and then longest, as the tokenizers library matches them.
  size_t from = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!t.added_first[static_cast<unsigned char>(text[i])]) continue;
    for (const auto& [content, id] : t.added)
      if (text.compare(i, content.size(), content) == 0) {
        detail::encode_plain(t, text.substr(from, i - from), out);
        out.push_back(id);
        from = i + content.size();
        i = from - 1;
        break;
      }
  }
  detail::encode_plain(t, text.substr(from), out);
}

std::string Gpt2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const detail::Gpt2TokenizerTables& t = *tables_;
  std::string out;
  out.reserve(ids.size() * 4);
  for (const int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= t.id_bytes.size() || !t.id_present[id]) {
      throw Error("cannot decode token id " + std::to_string(id) + ": not in the vocab (" +
                  std::to_string(t.vocab_size) + " entries)");
    }
    out += t.id_bytes[id];
  }
  return out;
}

int32_t Gpt2Tokenizer::eod() const {
  if (tables_->eod < 0) throw Error(tables_->eod_missing);
  return tables_->eod;
}

const std::vector<int32_t>& Gpt2Tokenizer::document_prefix() const { return tables_->prefix; }

std::string Gpt2Tokenizer::describe() const { return tables_->description; }

size_t Gpt2Tokenizer::vocab_size() const { return tables_->vocab_size; }

}  // namespace hpct::io
