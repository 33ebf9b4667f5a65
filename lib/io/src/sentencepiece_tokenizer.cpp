// SentencePiece models as Megatron's tokenizer types use them (sentencepiece_tokenizer.hpp).
#include "hpct/io/sentencepiece_tokenizer.hpp"

#include <sentencepiece_processor.h>

#include <utility>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/core/file.hpp"

namespace hpct::io {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& type, const std::string& path) : type_(type), path_(path) {
    const std::string bytes = read_regular_file(path, "SentencePiece model", kMaxTokenizerFileBytes,
                                                "--tokenizer-model names a SentencePiece .model file (spm_train writes one)");
    if (!sp_.LoadFromSerializedProto(bytes).ok())  // the library's message is its source line
      throw file_error(path, "is not a SentencePiece model (the library cannot parse it)",
                       "--tokenizer-model names a SentencePiece .model file (spm_train writes one)");
    pieces_ = sp_.GetPieceSize();
    vocab_ = static_cast<size_t>(pieces_);
    if (type == "SentencePieceTokenizer") {
      add_special("<CLS>"), add_special("<SEP>");
      eod_ = add_special("<EOD>");
      add_special("<MASK>");
      add_special(piece_or(sp_.pad_id(), "<PAD>"));
      add_special(piece_or(sp_.bos_id(), "<BOS>"));
      add_special(piece_or(sp_.eos_id(), "<EOS>"));
    } else {
      eod_ = sp_.eos_id();
      if (eod_ < 0) throw file_error(path, "has no eos piece (</s>), which " + type + " uses as end-of-document");
      if (type == "Llama2Tokenizer") {
        if (sp_.bos_id() < 0) throw file_error(path, "has no bos piece (<s>), which Llama2Tokenizer puts before every text");
        prefix_.push_back(sp_.bos_id());
      }
    }
  }

  void encode_append(std::string_view text, std::vector<int32_t>& out) const override {
    if (specials_.empty()) return encode_plain(text, out);
    // Megatron's (NeMo's) split: the earliest special token next, the first added on a tie.
    size_t from = 0;
    while (from < text.size()) {
      size_t best = std::string_view::npos;
      const std::pair<std::string, int32_t>* which = nullptr;
      for (const auto& s : specials_) {
        const size_t at = text.find(s.first, from);
        if (at < best) best = at, which = &s;
      }
      if (!which) break;
      encode_plain(text.substr(from, best - from), out);
      out.push_back(which->second);
      from = best + which->first.size();
    }
    encode_plain(text.substr(from), out);
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string text, part;
    std::vector<int> run;
    auto flush = [&] {
      if (const auto st = sp_.Decode(run, &part); !st.ok()) throw Error("SentencePiece decode failed: " + st.ToString());
      text += part;
      run.clear();
    };
    for (const int32_t id : ids) {
      if (id < 0 || static_cast<size_t>(id) >= vocab_)
        throw Error("cannot decode token id " + std::to_string(id) + ": not in the vocab of " + path_ + " (" +
                    std::to_string(vocab_) + " ids)");
      const auto* s = special_of(id);
      if (!s) {
        run.push_back(id);
        continue;
      }
      flush();  // Megatron's detokenize: a special token stands apart, between spaces
      text += " " + s->first + " ";
    }
    flush();
    return text;
  }

  int32_t eod() const override { return eod_; }
  const std::vector<int32_t>& document_prefix() const override { return prefix_; }
  size_t vocab_size() const override { return vocab_; }
  std::string describe() const override { return type_ + " " + path_; }

 private:
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    std::vector<int> ids;
    if (const auto st = sp_.Encode(text, &ids); !st.ok()) throw Error("SentencePiece encode failed: " + st.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }
  std::string piece_or(int id, const char* name) const { return id >= 0 && id < pieces_ ? sp_.IdToPiece(id) : name; }
  int32_t add_special(const std::string& piece) {
    int32_t id = -1;
    for (int i = 0; i < pieces_ && id < 0; ++i)  // the model's own piece where it has it
      if (sp_.IdToPiece(i) == piece) id = i;
    for (const auto& s : specials_)
      if (s.first == piece) return s.second;
    if (id < 0) id = static_cast<int32_t>(vocab_++);
    specials_.emplace_back(piece, id);
    return id;
  }
  const std::pair<std::string, int32_t>* special_of(int32_t id) const {
    for (const auto& s : specials_)
      if (s.second == id) return &s;
    return nullptr;
  }

  sentencepiece::SentencePieceProcessor sp_;
  std::string type_, path_;
  int pieces_ = 0;
  size_t vocab_ = 0;
  int32_t eod_ = -1;
  std::vector<int32_t> prefix_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // in the order added (ties go to the first)
};

}  // namespace

std::shared_ptr<const Tokenizer> open_sentencepiece(const std::string& type, const std::string& model_path) {
  if (type != "GPTSentencePieceTokenizer" && type != "Llama2Tokenizer" && type != "SentencePieceTokenizer")
    throw config_error("--tokenizer-type", "'" + type + "' is not a SentencePiece tokenizer type");
  return std::make_shared<SentencePieceTokenizer>(type, model_path);
}

}  // namespace hpct::io
