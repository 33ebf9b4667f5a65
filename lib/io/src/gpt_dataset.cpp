// Megatron's GPT sample index (gpt_dataset.py _build_index_mappings and helpers.cpp build_sample_idx),
// its --split parsing, and --mock-data. See gpt_dataset.hpp for what differs from Megatron and why.
//
// Not here: Megatron's numpy RandomState, so the orders differ from Megatron's for the same seed;
// what matches is the structure (epochs, sample boundaries, overlap, lengths).
#include "hpct/io/gpt_dataset.hpp"

#include "hpct/core/rng.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <random>

#include "hpct/core/error.hpp"

namespace hpct::io {
namespace {

// Uniform in [0, n) by rejection: exact on every platform, unlike std::uniform_int_distribution.
uint64_t below(std::mt19937_64& gen, uint64_t n) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;  // a multiple of n
  uint64_t x;
  do {
    x = gen();
  } while (x >= limit);
  return x % n;
}

// numpy's shuffle order (from the back), with our below().
void fisher_yates(std::mt19937_64& gen, int64_t* v, size_t n) {
  for (size_t i = n; i > 1; --i) {
    size_t j = static_cast<size_t>(below(gen, i));
    std::swap(v[i - 1], v[j]);
  }
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n\r"), e = s.find_last_not_of(" \t\n\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// --split

std::array<std::pair<size_t, size_t>, 3> split_document_ranges(const std::string& split, size_t num_docs) {
  const std::string hint = "give up to three non-negative weights for train,valid,test, e.g. 949,50,1 or 98/2/0";
  const char sep = split.find(',') != std::string::npos ? ',' : (split.find('/') != std::string::npos ? '/' : '\0');
  std::vector<std::string> parts;
  if (sep == '\0') {
    parts.push_back(split);
  } else {
    size_t start = 0;
    for (;;) {
      size_t pos = split.find(sep, start);
      parts.push_back(split.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
      if (pos == std::string::npos) break;
      start = pos + 1;
    }
  }
  if (parts.size() > 3)
    throw config_error("--split", "'" + split + "' has " + std::to_string(parts.size()) + " weights, expected at most 3", hint);
  std::array<double, 3> w{0, 0, 0};
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string t = trim(parts[i]);
    char* end = nullptr;
    double v = t.empty() ? NAN : std::strtod(t.c_str(), &end);
    if (t.empty() || *end != '\0' || !std::isfinite(v) || v < 0)
      throw config_error("--split", "cannot read weight '" + parts[i] + "' of '" + split + "'", hint);
    w[i] = v;
  }
  const double sum = w[0] + w[1] + w[2];
  if (!(sum > 0)) throw config_error("--split", "weights of '" + split + "' sum to zero", hint);

  // Python's int(round(x)) rounds half to even; so does nearbyint in the default rounding mode.
  std::array<long long, 4> idx{0, 0, 0, 0};
  for (int i = 0; i < 3; ++i) idx[i + 1] = idx[i] + static_cast<long long>(std::nearbyint(w[i] / sum * static_cast<double>(num_docs)));
  const long long diff = idx[3] - static_cast<long long>(num_docs);
  for (int i = 1; i < 4; ++i) idx[i] -= diff;
  std::array<std::pair<size_t, size_t>, 3> out;
  for (int i = 0; i < 3; ++i) {
    // Megatron can hand a negative boundary here for degenerate weights on a handful of documents.
    long long b = std::max(0LL, idx[i]), e = std::max(b, idx[i + 1]);
    out[i] = {static_cast<size_t>(b), static_cast<size_t>(e)};
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// GptDataset

GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> data, std::pair<size_t, size_t> documents,
                       size_t num_samples, size_t seq_length, uint64_t seed)
    : data_(std::move(data)), documents_(documents), seq_length_(seq_length) {
  if (!data_) throw Error("GptDataset: no indexed dataset");
  // Appended piecewise: GCC 12 gives a false -Wrestrict on "[" + std::to_string(...) at -O3.
  std::string range = "[";
  range += std::to_string(documents.first);
  range += ", ";
  range += std::to_string(documents.second);
  range += ")";
  const std::string& path = data_->prefix();
  if (seq_length == 0) throw config_error("--seq-length", "seq_length must be at least 1");
  if (documents.first >= documents.second)
    throw file_error(path, "empty document range " + range, "this split got no documents; check --split");
  if (documents.second > data_->num_documents())
    throw file_error(path, "document range " + range + " beyond the " + std::to_string(data_->num_documents()) +
                               " documents of the dataset");

  const size_t ndocs = documents.second - documents.first;
  const auto doc_idx = data_->doc_idx();
  const auto sizes = data_->sizes();
  doc_tokens_.resize(ndocs);
  for (size_t d = 0; d < ndocs; ++d) {
    int64_t t = 0;
    for (int64_t it = doc_idx[documents.first + d]; it < doc_idx[documents.first + d + 1]; ++it) t += sizes[it];
    doc_tokens_[d] = t;
    tokens_per_epoch_ += static_cast<uint64_t>(t);
  }
  if (tokens_per_epoch_ < seq_length + 1)
    throw file_error(path, "documents " + range + " hold " + std::to_string(tokens_per_epoch_) +
                               " tokens, fewer than one sample of seq_length+1 = " + std::to_string(seq_length + 1),
                     "use a smaller --seq-length or give this split more documents (--split)");

  // Megatron's _num_epochs: enough epochs that (tokens - 1) / seq_length samples cover the request.
  uint64_t total = 0;
  do {
    ++num_epochs_;
    total += tokens_per_epoch_;
  } while ((total - 1) / seq_length < num_samples);
  const size_t nsamples = static_cast<size_t>((total - 1) / seq_length);

  std::mt19937_64 gen(seed);
  doc_order_.resize(num_epochs_ * ndocs);
  for (size_t e = 0; e < num_epochs_; ++e) {
    int64_t* epoch = doc_order_.data() + e * ndocs;
    for (size_t d = 0; d < ndocs; ++d) epoch[d] = static_cast<int64_t>(documents.first + d);
    fisher_yates(gen, epoch, ndocs);
  }

  // helpers.cpp build_sample_idx: each sample takes seq_length+1 tokens and the next one starts on
  // the last of them.
  sample_idx_.resize(nsamples + 1);
  sample_idx_[0] = {0, 0};
  int64_t doc_pos = 0, doc_offset = 0;
  for (size_t s = 1; s <= nsamples; ++s) {
    int64_t remaining = static_cast<int64_t>(seq_length) + 1;
    while (remaining != 0) {
      const int64_t doc_length = doc_tokens_[doc_order_[doc_pos] - documents.first] - doc_offset;
      remaining -= doc_length;
      if (remaining <= 0) {
        doc_offset += remaining + doc_length - 1;
        remaining = 0;
      } else {
        ++doc_pos;
        doc_offset = 0;
      }
    }
    sample_idx_[s] = {doc_pos, doc_offset};
  }

  shuffle_idx_.resize(nsamples);
  for (size_t s = 0; s < nsamples; ++s) shuffle_idx_[s] = static_cast<int64_t>(s);
  fisher_yates(gen, shuffle_idx_.data(), nsamples);
}

void GptDataset::read_document(size_t doc, size_t offset, size_t length, int32_t* out) const {
  // A document is its items back to back (one item unless built with --split-sentences).
  const auto doc_idx = data_->doc_idx();
  const auto sizes = data_->sizes();
  for (int64_t it = doc_idx[doc]; it < doc_idx[doc + 1] && length > 0; ++it) {
    const size_t sz = static_cast<size_t>(sizes[it]);
    if (offset >= sz) {
      offset -= sz;
      continue;
    }
    const size_t n = std::min(length, sz - offset);
    data_->read(static_cast<size_t>(it), offset, n, out);
    out += n;
    length -= n;
    offset = 0;
  }
}

void GptDataset::get_ordered(size_t k, int32_t* out) const {
  if (k + 1 >= sample_idx_.size())
    throw Error("GptDataset: sample " + std::to_string(k) + " out of range (" + std::to_string(size()) + " samples)");
  const SamplePos f = sample_idx_[k], l = sample_idx_[k + 1];
  const size_t first_doc = doc_order_[f.doc_pos] - documents_.first;
  if (f.doc_pos == l.doc_pos) {
    read_document(doc_order_[f.doc_pos], f.offset, l.offset - f.offset + 1, out);
    return;
  }
  size_t n = static_cast<size_t>(doc_tokens_[first_doc] - f.offset);
  read_document(doc_order_[f.doc_pos], f.offset, n, out);
  out += n;
  for (int64_t p = f.doc_pos + 1; p < l.doc_pos; ++p) {
    n = static_cast<size_t>(doc_tokens_[doc_order_[p] - documents_.first]);
    read_document(doc_order_[p], 0, n, out);
    out += n;
  }
  read_document(doc_order_[l.doc_pos], 0, static_cast<size_t>(l.offset) + 1, out);
}

size_t GptDataset::first_document_tokens(size_t i) const {
  if (i >= shuffle_idx_.size())
    throw Error("GptDataset: sample " + std::to_string(i) + " out of range (" + std::to_string(size()) + " samples)");
  const size_t k = static_cast<size_t>(shuffle_idx_[i]);
  const SamplePos f = sample_idx_[k], l = sample_idx_[k + 1];
  if (f.doc_pos == l.doc_pos) return static_cast<size_t>(l.offset - f.offset + 1);
  return static_cast<size_t>(doc_tokens_[doc_order_[f.doc_pos] - documents_.first] - f.offset);
}

void GptDataset::get(size_t i, int32_t* out) const {
  if (i >= shuffle_idx_.size())
    throw Error("GptDataset: sample " + std::to_string(i) + " out of range (" + std::to_string(size()) + " samples)");
  get_ordered(static_cast<size_t>(shuffle_idx_[i]), out);
}

// ---------------------------------------------------------------------------------------------
// MockGptDataset

MockGptDataset::MockGptDataset(size_t vocab_size, size_t seq_length, uint64_t seed)
    : seq_length_(seq_length), seed_(splitmix64(seed ^ 0x6d6f636b64617461ULL /* "mockdata" */)) {
  if (vocab_size < 2) throw config_error("--vocab-size", "mock data needs a vocabulary of at least 2 tokens");
  if (vocab_size > static_cast<size_t>(INT32_MAX)) throw config_error("--vocab-size", "vocab_size does not fit int32 token ids");
  if (seq_length == 0) throw config_error("--seq-length", "seq_length must be at least 1");
  // The table has its own stream of the seed, apart from the per-sample streams of get().
  const uint64_t table_key = splitmix64(seed_ ^ 0x7375636365737372ULL /* "successr" */);
  successor_.resize(vocab_size);
  for (size_t v = 0; v < vocab_size; ++v) successor_[v] = static_cast<int32_t>(splitmix64(table_key + v) % vocab_size);
}

void MockGptDataset::get(size_t i, int32_t* out) const {
  const uint64_t V = successor_.size();
  const uint64_t key = splitmix64(seed_ ^ splitmix64(static_cast<uint64_t>(i) + 1));
  // The modulo bias of a 64-bit hash over a vocabulary below 2^31 is under 2^-33: irrelevant here.
  out[0] = static_cast<int32_t>(splitmix64(key) % V);
  for (size_t t = 1; t <= seq_length_; ++t) {
    const uint64_t h = splitmix64(key + t);
    out[t] = (h & 7) == 0 ? static_cast<int32_t>((h >> 3) % V) : successor_[out[t - 1]];
  }
}

}  // namespace hpct::io

namespace hpct::io {

void EodMaskedDataset::get_loss_mask(size_t i, uint8_t* out) const {
  const size_t T = inner_->seq_length();
  std::vector<int32_t> tokens(T + 1);
  inner_->get(i, tokens.data());
  if (inner_->has_loss_mask()) inner_->get_loss_mask(i, out);
  else std::fill(out, out + T, uint8_t{1});
  for (size_t t = 0; t < T; ++t)
    if (tokens[t] == eod_) out[t] = 0;  // target t follows input token t
}

}  // namespace hpct::io
