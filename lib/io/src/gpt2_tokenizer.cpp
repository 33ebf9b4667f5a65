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
  std::array<int32_t, 256> byte_id{};  // the single-byte tokens BPE starts from
  MergeTable merges;
  std::unique_ptr<pcre2_code, CodeDeleter> regex;
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
  std::unordered_map<std::string, int32_t> bytes_to_id;  // only needed to resolve the merges
  bytes_to_id.reserve(vocab.size());
  std::string bytes;
  for (const auto& [token, value] : vocab.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= kMaxId) {
      throw file_error(vocab_path, "GPT-2 vocab entry '" + token + "' has id " + value.dump() +
                                       ", expected an integer in [0, " + std::to_string(kMaxId) + ")");
    }
    const auto id = static_cast<int32_t>(value.get<int64_t>());
    if (static_cast<size_t>(id) >= t->id_bytes.size()) {
      t->id_bytes.resize(static_cast<size_t>(id) + 1);
      t->id_present.resize(static_cast<size_t>(id) + 1, 0);
    }
    if (t->id_present[id]) {
      throw file_error(vocab_path, "GPT-2 vocab uses id " + std::to_string(id) + " twice (again for '" + token + "')");
    }
    t->id_present[id] = 1;
    if (byte_level_to_bytes(token, bytes)) {
      bytes_to_id.emplace(bytes, id);
      t->id_bytes[id] = bytes;
    } else {
      t->id_bytes[id] = token;  // a special token outside the byte alphabet decodes to its text
    }
    if (token == kEndOfText) t->eod = id;
  }
  t->vocab_size = vocab.size();
  vocab = nullptr;  // the parsed JSON is several times the file's size; free it before the merges
  for (int b = 0; b < 256; ++b) {
    const auto it = bytes_to_id.find(std::string(1, static_cast<char>(b)));
    if (it == bytes_to_id.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      throw file_error(vocab_path, std::string("GPT-2 vocab has no token for byte ") + hex,
                       "a byte-level BPE vocab holds all 256 single-byte tokens");
    }
    t->byte_id[b] = it->second;
  }

  // --- merges: optional "#version" line, then "left right" per line, rank = order ---
  const std::string text = read_regular_file(merges_path, "GPT-2 merges file", Gpt2Tokenizer::kMaxFileBytes, kFetchHint);
  std::unordered_map<uint64_t, MergeTable::Merge> merges;
  merges.reserve(t->vocab_size);
  int32_t rank = 0;
  size_t line_no = 0;
  std::string left_bytes, right_bytes;
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
    std::array<int32_t, 3> ids{};  // left, right, merged
    for (int k = 0; k < 2; ++k) {
      std::string& b = k == 0 ? left_bytes : right_bytes;
      const auto it = byte_level_to_bytes(fields[k], b) ? bytes_to_id.find(b) : bytes_to_id.end();
      if (it == bytes_to_id.end()) throw malformed("symbol '" + std::string(fields[k]) + "' is not in the vocab");
      ids[k] = it->second;
    }
    const auto merged = bytes_to_id.find(left_bytes + right_bytes);
    if (merged == bytes_to_id.end()) {
      throw malformed("merged symbol '" + std::string(fields[0]) + std::string(fields[1]) + "' is not in the vocab");
    }
    ids[2] = merged->second;
    // A repeated pair takes its later rank, as dict(zip(merges, range(n))) does in encoder.py.
    merges[MergeTable::pack(ids[0], ids[1])] = MergeTable::Merge{rank++, ids[2]};
  }
  t->merges.build(merges);

  // --- the pre-tokenizer ---
  // PCRE2_MATCH_INVALID_UTF lets the matcher step over bytes that are not UTF-8 instead of failing
  // the whole text; encode() turns what it stepped over into pieces of their own.
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  t->regex.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                               PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr));
  if (!t->regex) throw Error("cannot compile GPT-2 pre-tokenizer regex: " + pcre2_message(err));
  // JIT is ~5x faster than the interpreter; where it is unavailable pcre2_match falls back by itself.
  (void)pcre2_jit_compile(t->regex.get(), PCRE2_JIT_COMPLETE);

  return Gpt2Tokenizer(std::move(t));
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 4 + 1);  // English runs ~4.5 bytes per token
  encode_append(text, out);
  return out;
}

void Gpt2Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  using namespace detail;
  const Gpt2TokenizerTables& t = *tables_;
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
    bpe_piece(t, scratch, piece, out);
    it->second.second = out.size() - it->second.first;
  };

  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(t.regex.get(), subject, text.size(), pos, 0, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw Error("GPT-2 pre-tokenizer failed at byte " + std::to_string(pos) + ": " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    // Every valid character matches some alternative, so a gap is exactly a run of invalid UTF-8.
    if (ov[0] > pos) emit(text.substr(pos, ov[0] - pos));
    emit(text.substr(ov[0], ov[1] - ov[0]));
    pos = ov[1];  // no alternative matches the empty string, so this always advances
  }
  if (pos < text.size()) emit(text.substr(pos));
}

std::string Gpt2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const detail::Gpt2TokenizerTables& t = *tables_;
  std::string out;
  out.reserve(ids.size() * 4);
  for (const int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= t.id_bytes.size() || !t.id_present[id]) {
      throw Error("cannot decode token id " + std::to_string(id) + ": not in the GPT-2 vocab (" +
                  std::to_string(t.vocab_size) + " entries)");
    }
    out += t.id_bytes[id];
  }
  return out;
}

int32_t Gpt2Tokenizer::eod() const {
  if (tables_->eod < 0) throw Error(std::string("the GPT-2 vocab has no end-of-document token ") + detail::kEndOfText);
  return tables_->eod;
}

size_t Gpt2Tokenizer::vocab_size() const { return tables_->vocab_size; }

}  // namespace hpct::io
