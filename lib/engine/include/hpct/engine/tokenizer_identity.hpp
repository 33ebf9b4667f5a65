// hpct/engine/tokenizer_identity.hpp — which tokenizer a checkpoint was trained with, as its
// CheckpointMeta::tokenizer stores it ("gpt2-bpe vocab:fnv1a64:H merges:fnv1a64:H"), and the check
// every reader of a checkpoint makes before it uses (or publishes) the tokenizer files the
// checkpoint's config names: those paths come from a file anyone may have edited.
#pragma once

#include <string>

namespace hpct::engine {

/// CheckpointMeta::tokenizer of a run with this GPT-2 BPE vocab and merges file (each file's FNV-1a
/// 64; "unreadable" for one that is not a regular file of at most Gpt2Tokenizer::kMaxFileBytes).
std::string tokenizer_identity(const std::string& vocab_file, const std::string& merge_file);

/// FNV-1a 64 of the bytes, as tokenizer_identity writes it (16 hex digits).
std::string bytes_fingerprint(const std::string& bytes);

/// The fingerprint `identity` stores for one file (`which`: "vocab" or "merges"); "" when the
/// identity is not a GPT-2 BPE one (mock data, imported weights without tokenizer files).
std::string stored_fingerprint(const std::string& identity, const std::string& which);

/// "" when `bytes` (read from `path`) are the `which` file of the tokenizer `identity` names;
/// otherwise why not, in words that name the path ("/x/vocab.json is not the vocab file the
/// checkpoint was trained with (fnv1a64 A; the checkpoint has B)").
std::string tokenizer_file_problem(const std::string& identity, const std::string& which, const std::string& path,
                                   const std::string& bytes);

}  // namespace hpct::engine
