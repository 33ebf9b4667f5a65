// hpct/engine/checkpoint/checkpoint_state.hpp — the run state a checkpoint stores beside its tensors (iteration,
// consumed samples, optimizer step, loss scaler, config, architecture, tokenizer, seed, layout),
// read back through one set of checks that both Checkpointer::load and `hpct_ckpt verify` run.
//
// The attributes are covered by one checksum ("run_state_checksum", FNV-1a over their stored text),
// so an edited or corrupted iteration or architecture is refused like a corrupt tensor; values are
// range-checked as well (a checkpoint from before the checksum has only the range checks).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "hpct/core/param_layout.hpp"
#include "hpct/engine/checkpoint/checkpointer.hpp"
#include "hpct/io/h5_file.hpp"
#include "hpct/model/gpt.hpp"

namespace hpct::engine {

inline constexpr const char* kCheckpointFormat = "hpctrain-checkpoint/1";

/// A checkpoint's run state as stored.
struct StoredRun {
  TrainingState state;
  CheckpointMeta meta;
};

/// The checksum begin_save stores and read_stored_run checks: over the values as they are written.
uint64_t run_state_checksum(const TrainingState& s, const CheckpointMeta& m);

/// Where the run-state attributes come from: an open checkpoint's root, or a map (tests, the fuzz
/// target). Each returns nothing for an absent attribute (or one of another type).
struct RunStateAttrs {
  std::function<std::optional<std::string>(const char*)> str;
  std::function<std::optional<int64_t>(const char*)> i64;
  std::function<std::optional<uint64_t>(const char*)> u64;
};
/// The checks of read_stored_run on attributes from anywhere.
StoredRun parse_stored_run(const RunStateAttrs& attrs, const std::string& file);

/// Local. Reads every run-state attribute of `f` and checks it: present, of its type, JSON where
/// JSON is stored, in range (iteration >= 0, optimizer step and skipped iterations <= iteration,
/// consumed samples >= iteration), and the checksum. Throws hpct::Error naming `file` and the attribute.
StoredRun read_stored_run(const io::H5File& f, const std::string& file);

/// Local. What load refuses besides tensors: another architecture, another tokenizer (unless the
/// stored one is "unknown: ...", as an import writes) or, past iteration 0, another seed than this
/// run's (the data order is a function of the seed). Each named with both values.
void check_compatible(const StoredRun& r, const CheckpointMeta& here, const std::string& file);

/// Local. Every tensor of `layout` present in the three groups (model, exp_avg, exp_avg_sq) with
/// its shape, and no other tensor.
/// Then the root attribute `tensor_checksums` (required) against tensor_set_digest of the stored
/// per-tensor checksums: a stored checksum is bound to its tensor's name and shape.
/// groups: 3 (weights and both Adam moments) or 1 (weights only: a --no-save-optim checkpoint).
void check_tensor_set(const io::H5File& f, const ParamLayout& layout, const std::string& file, int groups = 3);

/// FNV-1a 64 over one "dataset shape checksum" line per tensor, sorted by dataset name: two
/// same-shape tensors swapped with their checksums, or one tensor hard-linked under another's
/// name, change it. (FNV-1a guards against damage and mix-ups, not against an author.)
struct TensorChecksum {
  std::string dataset;
  std::vector<int64_t> shape;
  uint64_t checksum = 0;
};
uint64_t tensor_set_digest(std::vector<TensorChecksum> tensors);

/// Local. What a tool checks before reading tensor data (hpct_ckpt verify, export): read_stored_run,
/// the GPT its architecture describes (into *cfg), its dataset count against 3 x (12 L + 4) before
/// the model's layout is built (an architecture claiming far more than the file holds is refused
/// there), then check_tensor_set.
StoredRun check_structure(const io::H5File& f, const std::string& file, model::GptConfig* cfg);

/// A checkpoint's model weights, whole, with the architecture they belong to (generate, finetuning).
struct CheckpointWeights {
  std::string file;         // the file read (a directory's `latest` resolved)
  model::GptConfig cfg;     // the stored architecture (vocabulary = its padded size)
  StoredRun stored;         // its run state and provenance (config, tokenizer)
  std::vector<float> params;  // fp32 master weights in Gpt::layout_for(cfg).trained() order
};

/// Local. Reads `path` (a checkpoint file or a --save directory with `latest`) after check_structure's
/// checks: a whole model, or with `adapters` a LoRA run's adapters (what its checkpoints hold; cfg
/// then has the LoRA settings). Throws naming the path or file, also when the kind differs.
CheckpointWeights read_checkpoint_weights(const std::string& path, bool adapters = false);

/// What a checkpoint records of a model's shape (its "architecture" attribute): the one writer,
/// for training runs and imports alike. The position table's rows are max_position_embeddings;
/// the training sequence length is a run setting (in the config), free to change on resume.
nlohmann::json architecture_of(const model::GptConfig& cfg);

/// The GPT a stored architecture describes (vocabulary = its padded size; max_seq_length = its
/// positions; files written before max_position_embeddings was recorded give seq_length) (vocabulary = its padded size), for tools that check a
/// checkpoint without a run. Throws naming `file` for a missing or impossible field.
model::GptConfig gpt_config_of(const nlohmann::json& architecture, const std::string& file);

}  // namespace hpct::engine
