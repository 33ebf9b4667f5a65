// GPT-2 byte-level BPE: loading the vocab/merges files, pre-tokenizing with PCRE2, merging by rank
// (the tokenizer.json loader is hf_tokenizer_json.cpp; the shared tables byte_level_bpe.hpp).
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

#include "byte_level_bpe.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/file.hpp"

namespace hpct::io {
namespace detail {
namespace {

constexpr const char* kFetchHint = "scripts/fetch_tokenizer.sh fetches GPT-2's gpt2-vocab.json and gpt2-merges.txt";
constexpr const char* kPairHint = "the merges file must belong to the same tokenizer as the vocab file";

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

}  // namespace

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
