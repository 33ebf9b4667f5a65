// preprocess_data — Megatron's tools/preprocess_data.py: documents in (JSONL with one {"text": ...}
// per line, or plain text with documents separated by blank lines; plain or gzip/zstd/bzip2
// compressed, one file or several in order: io/text_source.hpp), token ids out as the indexed
// dataset {prefix}_{key}_document.bin/.idx that pretrain_gpt --data-path reads.
//
// Not here: --split-sentences (it needs NLTK's punkt model), --partitions, tokenizers other than
// GPT2BPETokenizer. Trade-off: a batch of documents is read, tokenized on --workers threads, then
// written in input order; reading and writing wait while a batch is tokenized. Tokenizing dominates
// by far, and this keeps the output order (and so the dataset) identical for any number of workers.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "hpct/core/cli.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/report.hpp"
#include "hpct/io/tokenizer.hpp"
#include "hpct/io/indexed_dataset.hpp"
#include "hpct/io/text_source.hpp"

#include <glob.h>

using namespace hpct;

namespace {

constexpr const char* kUsage = R"(usage: preprocess_data --input FILE [FILE ...] --output-prefix PREFIX
                       (--vocab-file FILE --merge-file FILE | --tokenizer-type TYPE --tokenizer-model FILE)
                       [--json-keys KEY [KEY ...]] [--append-eod]
                       [--workers N] [--log-interval N] [--input-format auto|json|text] [--dataset-impl mmap]

Tokenizes documents into Megatron indexed datasets {PREFIX}_{KEY}_document.bin/.idx.

  --input FILE ...      JSONL, one object per line whose KEY holds a string (or a list of strings,
                        each stored as one item of the document); or plain text, one document per
                        run of lines up to a blank line. Plain, or compressed with gzip, zstd or
                        bzip2 (known by the file's first bytes); any other binary file is refused.
                        Several files and globs ("shard_*.jsonl.zst", quoted) are read in the order
                        given, each glob's matches sorted, into one dataset
  --input-format F      auto (default: json for *.json/*.jsonl, also compressed: *.jsonl.zst, ...;
                        else text), json or text
  --output-prefix P     output path prefix; files are P_KEY_document.{bin,idx}
  --tokenizer-type T    GPT2BPETokenizer (default: --vocab-file, --merge-file);
                        GPTSentencePieceTokenizer, Llama2Tokenizer (<s> before each item) or
                        SentencePieceTokenizer (Megatron's added <EOD> ...): --tokenizer-model a
                        SentencePiece .model; HFTokenizer: a byte-level BPE tokenizer.json (or its
                        folder; its template's tokens before each item)
  --tokenizer-model F   the SentencePiece model or tokenizer.json
  --vocab-file FILE     GPT-2 vocab.json
  --merge-file FILE     GPT-2 merges.txt
  --json-keys KEY...    keys to extract (default: text); one dataset per key
  --append-eod          append the tokenizer's end-of-document id after each document
  --workers N           tokenizer threads (default 1); the output is identical for any N
  --log-interval N      report progress every N documents (default 1000)
  --dataset-impl mmap   accepted for compatibility; mmap is the only format written
  -h, --help            this text
  --version             version and git commit
  @FILE                 the flags written in FILE

Exit status: 0 on success, 1 on any error (one line on stderr).
)";

struct Options {
  std::vector<std::string> inputs;  // the files, globs expanded
  std::string output_prefix;
  io::TokenizerSpec tokenizer;
  std::string input_format = "auto";
  std::vector<std::string> json_keys = {"text"};
  bool append_eod = false;
  size_t workers = 1;
  size_t log_interval = 1000;
  bool help = false;
};

Options parse_args(int argc, char** argv) {
  Options o;
  cli::Parser p("preprocess_data");
  auto count = [](const std::string& f, const std::string& v) { return static_cast<size_t>(cli::to_int(f, v, 1)); };
  p.flag("--input", -1, [&](const std::string& v) {  // nargs='+': files and globs (paths without spaces)
    o.inputs.clear();
    std::istringstream is(v);
    for (std::string pattern; is >> pattern;) {
      if (pattern.find_first_of("*?[") == std::string::npos) {
        o.inputs.push_back(pattern);
        continue;
      }
      glob_t g{};
      const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
      if (rc != 0) {
        globfree(&g);
        throw config_error("--input", "--input '" + printable(pattern) + "' matches no file");
      }
      for (size_t i = 0; i < g.gl_pathc; ++i) o.inputs.push_back(g.gl_pathv[i]);  // sorted by glob(3)
      globfree(&g);
    }
  });
  p.flag("--output-prefix", 1, [&](const std::string& v) { o.output_prefix = v; });
  p.flag("--vocab-file", 1, [&](const std::string& v) { o.tokenizer.vocab_file = v; });
  p.flag("--merge-file", 1, [&](const std::string& v) { o.tokenizer.merge_file = v; });
  p.flag("--tokenizer-type", 1, [&](const std::string& v) { o.tokenizer.type = v; });
  p.flag("--tokenizer-model", 1, [&](const std::string& v) { o.tokenizer.model = v; });
  p.flag("--input-format", 1, [&](const std::string& v) { o.input_format = v; });
  p.flag("--append-eod", 0, [&](const std::string&) { o.append_eod = true; });
  p.flag("--workers", 1, [&](const std::string& v) { o.workers = count("--workers", v); });
  p.flag("--log-interval", 1, [&](const std::string& v) { o.log_interval = count("--log-interval", v); });
  p.flag("--dataset-impl", 1, [&](const std::string& v) {
    if (v != "mmap")
      throw config_error("--dataset-impl", "--dataset-impl '" + printable(v) + "' is not supported",
                         "only mmap (MMIDIDX) datasets are written");
  });
  p.flag("--json-keys", -1, [&](const std::string& v) {  // argparse nargs='+': every word up to the next flag
    o.json_keys.clear();
    std::istringstream is(v);
    for (std::string k; is >> k;) o.json_keys.push_back(k);
  });
  for (const char* f : {"--split-sentences", "--keep-newlines"})
    p.flag(f, 0, [f](const std::string&) {
      throw config_error(f, std::string(f) + " is not supported by this preprocess_data", "documents are stored whole");
    });
  p.flag("--partitions", 1, [](const std::string&) {
    throw config_error("--partitions", "--partitions is not supported by this preprocess_data", "documents are stored whole");
  });
  o.help = !p.parse(argc, argv);
  if (o.help) return o;
  if (o.inputs.empty()) throw config_error("--input", "missing --input");
  if (o.output_prefix.empty()) throw config_error("--output-prefix", "missing --output-prefix");
  io::check_tokenizer_spec(o.tokenizer);
  if (o.input_format != "auto" && o.input_format != "json" && o.input_format != "text")
    throw config_error("--input-format", "--input-format expects auto, json or text, got '" + o.input_format + "'");
  if (o.input_format == "auto") {  // by the first file's name, a compression suffix aside
    std::string name = o.inputs.front();
    auto ends_with = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    for (const char* z : {".gz", ".zst", ".zstd", ".bz2"})
      if (ends_with(z)) name.resize(name.size() - std::strlen(z));
    o.input_format = ends_with(".json") || ends_with(".jsonl") ? "json" : "text";
  }
  if (o.input_format == "text" && o.json_keys.size() != 1)
    throw config_error("--json-keys", "plain text input has one field: give --json-keys one key (it names the output)");
  return o;
}

// One document as read, and what tokenizing it gave: per key, the items (one per string).
struct Doc {
  const std::string* file = nullptr;  // the input file it is in
  size_t line = 0;  // its first line in that file, for messages
  std::string raw;  // a JSON line, or the text itself
  std::vector<std::vector<std::vector<int32_t>>> items;  // (keys, items, tokens)
  std::exception_ptr error;
};

// Reads the next batch: stops after max_docs documents or max_bytes of input. The files are read
// one after the other; a document never spans two files.
class Reader {
 public:
  // Every file is opened (and its format checked) before anything is written.
  Reader(const std::vector<std::string>& paths, bool json) : json_(json) {
    for (const auto& p : paths) sources_.emplace_back(p);
  }
  bool next_batch(std::vector<Doc>& batch, size_t max_docs, size_t max_bytes) {
    batch.clear();
    size_t bytes = 0;
    std::string line;
    Doc cur;
    bool in_doc = false;
    while (batch.size() < max_docs && bytes < max_bytes && next_line(line, in_doc, cur, batch, bytes)) {
      ++line_no_;
      const bool blank = line.find_first_not_of(" \t\r\f\v") == std::string::npos;
      if (json_) {
        if (blank) continue;  // tolerate blank lines, e.g. at the end
        batch.push_back(Doc{&path(), line_no_, std::move(line), {}, nullptr});
        bytes += batch.back().raw.size();
        continue;
      }
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (blank) {
        if (in_doc) {
          bytes += cur.raw.size();
          batch.push_back(std::move(cur));
          cur = Doc{};
          in_doc = false;
        }
        continue;
      }
      if (!in_doc) {
        cur.file = &path();
        cur.line = line_no_;
        in_doc = true;
      } else {
        cur.raw += '\n';
      }
      cur.raw += line;
    }
    // A text document in progress continues into the next batch only if we stopped early; keep it
    // simple by finishing it here (it is at most one document over the limits).
    if (in_doc) {
      while (at_ < sources_.size() && sources_[at_].getline(line)) {
        ++line_no_;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t\r\f\v") == std::string::npos) break;
        cur.raw += '\n';
        cur.raw += line;
      }
      batch.push_back(std::move(cur));
    }
    return !batch.empty();
  }
  /// Bytes of the files read so far (compressed bytes for compressed files).
  uint64_t bytes_read() const {
    uint64_t n = 0;
    for (const auto& s : sources_) n += s.file_bytes();
    return n;
  }
  /// Each file's compression, for the start line ("zstd" or "none, gzip, ...").
  std::string compressions() const {
    std::string all;
    for (const auto& s : sources_)
      if (all.find(s.compression()) == std::string::npos) all += (all.empty() ? "" : ", ") + std::string(s.compression());
    return all;
  }

 private:
  const std::string& path() const { return sources_[at_].path(); }
  // The next line of the current file, moving on to the next file at its end (a text document in
  // progress ends with its file).
  bool next_line(std::string& line, bool& in_doc, Doc& cur, std::vector<Doc>& batch, size_t& bytes) {
    while (at_ < sources_.size()) {
      if (sources_[at_].getline(line)) return true;
      if (in_doc) {
        bytes += cur.raw.size();
        batch.push_back(std::move(cur));
        cur = Doc{};
        in_doc = false;
      }
      ++at_;
      line_no_ = 0;
    }
    return false;
  }

  bool json_;
  std::vector<io::TextSource> sources_;
  size_t at_ = 0;  // the file being read
  size_t line_no_ = 0;
};

void tokenize(Doc& doc, const Options& o, const io::Tokenizer& tok, bool json) {
  const std::string where = "line " + std::to_string(doc.line) + ": ";
  std::vector<std::vector<std::string>> texts(o.json_keys.size());
  if (json) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(doc.raw);
    } catch (const nlohmann::json::exception& e) {
      std::string msg = e.what();
      if (auto p = msg.find("] "); p != std::string::npos) msg = msg.substr(p + 2);  // drop "[json.exception...]"
      if (msg.rfind("parse error at line 1, ", 0) == 0) msg = "parse error at " + msg.substr(23);  // our line is the line
      throw file_error(*doc.file, where + "invalid JSON: " + msg);
    }
    if (!j.is_object()) throw file_error(*doc.file, where + "expected a JSON object");
    for (size_t k = 0; k < o.json_keys.size(); ++k) {
      auto it = j.find(o.json_keys[k]);
      if (it == j.end()) throw file_error(*doc.file, where + "no key '" + o.json_keys[k] + "'", "check --json-keys");
      if (it->is_string()) {
        texts[k].push_back(it->get<std::string>());
      } else if (it->is_array() && std::all_of(it->begin(), it->end(), [](const auto& x) { return x.is_string(); })) {
        for (const auto& s : *it) texts[k].push_back(s.get<std::string>());
      } else {
        throw file_error(*doc.file, where + "'" + o.json_keys[k] + "' must be a string or a list of strings");
      }
    }
  } else {
    texts[0].push_back(std::move(doc.raw));
  }
  doc.raw.clear();
  doc.raw.shrink_to_fit();
  doc.items.resize(o.json_keys.size());
  for (size_t k = 0; k < texts.size(); ++k) {
    for (const std::string& s : texts[k]) {
      std::vector<int32_t> ids = tok.document_prefix();  // as Megatron's tokenize() (Llama2Tokenizer's <s>)
      tok.encode_append(s, ids);
      if (!ids.empty()) doc.items[k].push_back(std::move(ids));  // Megatron drops empty ones (a lone <s> is kept, as there)
    }
    if (o.append_eod && !doc.items[k].empty()) doc.items[k].back().push_back(tok.eod());
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  if (o.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto tokenizer = io::open_tokenizer(o.tokenizer);
  const io::Tokenizer& tok = *tokenizer;
  const io::DType dtype = io::best_fitting_dtype(tok.vocab_size());
  const bool json = o.input_format == "json";
  Reader reader(o.inputs, json);

  const auto parent = std::filesystem::path(o.output_prefix).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent))
    throw file_error(o.output_prefix, "output directory " + parent.string() + " does not exist");
  std::vector<std::string> outputs;
  std::vector<std::unique_ptr<io::IndexedDatasetBuilder>> builders;
  for (const std::string& key : o.json_keys) {
    outputs.push_back(o.output_prefix + "_" + key + "_document");
    builders.push_back(std::make_unique<io::IndexedDatasetBuilder>(outputs.back(), dtype));
  }
  const std::string inputs = o.inputs.size() == 1 ? o.inputs[0] : std::to_string(o.inputs.size()) + " files";
  std::printf("preprocess_data: %s -> %s_{%s}_document (%s, compression %s, vocab %zu, dtype %s, %zu worker%s)\n",
              inputs.c_str(),
              o.output_prefix.c_str(), [&] {
                std::string s;
                for (const auto& k : o.json_keys) s += (s.empty() ? "" : ",") + k;
                return s;
              }().c_str(),
              json ? "jsonl" : "text", reader.compressions().c_str(), tok.vocab_size(), io::dtype_name(dtype), o.workers, o.workers == 1 ? "" : "s");
  if (o.tokenizer.type != "GPT2BPETokenizer")
    std::printf("preprocess_data: tokenizer %s (%zu id(s) before each item%s)\n", tok.describe().c_str(),
                tok.document_prefix().size(), o.append_eod ? (", end-of-document id " + std::to_string(tok.eod())).c_str() : "");
  std::fflush(stdout);

  const auto t_start = std::chrono::steady_clock::now();
  std::vector<Doc> batch;
  size_t docs = 0, next_log = o.log_interval;
  // Enough per batch to keep every worker busy, small enough to report progress often.
  const size_t max_docs = std::max<size_t>(64, 16 * o.workers), max_bytes = (size_t{2} << 20) * o.workers;
  while (reader.next_batch(batch, max_docs, max_bytes)) {
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < batch.size();) {
        try {
          tokenize(batch[i], o, tok, json);
        } catch (...) {
          batch[i].error = std::current_exception();
        }
      }
    };
    if (o.workers == 1) {
      work();
    } else {
      std::vector<std::thread> pool;
      for (size_t w = 0; w < std::min(o.workers, batch.size()); ++w) pool.emplace_back(work);
      for (auto& t : pool) t.join();
    }
    for (Doc& d : batch) {
      if (d.error) std::rethrow_exception(d.error);  // the first bad document in input order
      for (size_t k = 0; k < builders.size(); ++k) {
        if (d.items[k].empty()) continue;  // as Megatron: an empty document is skipped
        for (const auto& item : d.items[k]) builders[k]->add_item(item);
        builders[k]->end_document();
      }
      if (++docs == next_log) {
        const double s = seconds_since(t_start);
        std::printf("processed %zu documents (%.1f docs/s, %.2f MB/s)\n", docs, docs / s,
                    reader.bytes_read() / s / 1e6);
        std::fflush(stdout);
        next_log += o.log_interval;
      }
    }
  }
  for (auto& b : builders) b->finalize();
  const double s = seconds_since(t_start);
  for (size_t k = 0; k < builders.size(); ++k) {
    std::printf("preprocess_data: done: %s.{bin,idx}: %zu documents (of %zu read), %llu tokens\n", outputs[k].c_str(),
                builders[k]->num_documents(), docs, static_cast<unsigned long long>(builders[k]->num_tokens()));
  }
  std::printf("preprocess_data: %.2f s (%.2f s with startup), %.2f MB/s, %.0f tokens/s\n", s, seconds_since(t0),
              reader.bytes_read() / s / 1e6, builders.empty() ? 0.0 : builders[0]->num_tokens() / s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (hpct::print_version_if_asked("preprocess_data", argc, argv)) return 0;
  try {
    return run(argc, argv);
  } catch (const hpct::Error& e) {
    std::fprintf(stderr, "preprocess_data: error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "preprocess_data: error: %s\n", e.what());
  }
  return 1;
}
