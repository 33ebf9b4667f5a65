// hpct/engine/checkpoint/tokenizer_identity.hpp — which tokenizer a checkpoint was trained with, as its
// CheckpointMeta::tokenizer stores it ("gpt2-bpe vocab:fnv1a64:H merges:fnv1a64:H" for GPT-2's
// BPE; "TYPE model:fnv1a64:H" or "HFTokenizer tokenizer:fnv1a64:H" for the others), the tokenizer
// spec a checkpoint's config names, and the check every reader of a checkpoint makes before it
// uses (or publishes) those files: their paths come from a file anyone may have edited.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "hpct/io/tokenizer.hpp"

namespace hpct::engine {

/// CheckpointMeta::tokenizer of a run with this tokenizer (each file's FNV-1a 64; "unreadable" for
/// one that is not a regular file of at most io::kMaxTokenizerFileBytes).
std::string tokenizer_identity(const io::TokenizerSpec& spec);

/// The tokenizer a checkpoint's config (config_to_json) names; a config from before
/// --tokenizer-type is GPT2BPETokenizer. Empty files where the config names none.
io::TokenizerSpec stored_tokenizer_spec(const nlohmann::json& config);

/// FNV-1a 64 of the bytes, as tokenizer_identity writes it (16 hex digits).
std::string bytes_fingerprint(const std::string& bytes);

/// The fingerprint `identity` stores for one file (`which`: "vocab", "merges", "model" or
/// "tokenizer"); "" when it stores none (mock data, imported weights without tokenizer files).
std::string stored_fingerprint(const std::string& identity, const std::string& which);

/// "" when `bytes` (read from `path`) are the `which` file of the tokenizer `identity` names;
/// otherwise why not, in words that name the path ("/x/vocab.json is not the vocab file the
/// checkpoint was trained with (fnv1a64 A; the checkpoint has B)").
std::string tokenizer_file_problem(const std::string& identity, const std::string& which, const std::string& path,
                                   const std::string& bytes);

/// Opens the tokenizer `spec` names after checking each of its files against `identity` (the
/// checkpoint `file`'s); a mismatch or an unreadable file throws a config error naming the file's
/// flag (--vocab-file, --merge-file, --tokenizer-model).
std::shared_ptr<const io::Tokenizer> open_checked_tokenizer(const io::TokenizerSpec& spec, const std::string& identity,
                                                            const std::string& file);

}  // namespace hpct::engine
