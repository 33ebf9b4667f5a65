// The DeepSpeed ds_config sections real configs carry besides the ones that size and shape a run:
// activation checkpointing, checkpoint options, data types, gradient pre-division, profilers and
// network monitors. Each maps onto what this version does, says in one note that it changes nothing
// here (and why), or is refused by name; none is dropped silently.
#include <string>
#include <utility>
#include <vector>

#include "flag_parse.hpp"
#include "hpct/core/error.hpp"

namespace hpct::engine::detail {

namespace {

std::string joined(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

bool enabled(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_object() && j[key].contains("enabled") && j[key]["enabled"] == true;
}

}  // namespace

void apply_ds_runtime_sections(JsonSection& root, const nlohmann::json& j, TrainConfig& cfg) {
  auto note = [&](const std::string& what, const std::string& why) {
    cfg.notes.push_back("ds_config " + what + " has no effect here: " + why);
  };
  // DeepSpeed checkpoints the layers a model hands it; Megatron-DeepSpeed hands it every layer.
  if (root.has("activation_checkpointing")) {
    JsonSection a = root.section("activation_checkpointing");
    if (a.get_bool("cpu_checkpointing").value_or(false))
      throw Error("activation_checkpointing.cpu_checkpointing (checkpoints moved to CPU memory) is not implemented",
                  Error::Context{root.file(), "activation_checkpointing.cpu_checkpointing",
                                 "set it false: every layer is recomputed from its input, which stays where the model runs"});
    std::vector<std::string> inert;
    for (const char* k : {"partition_activations", "contiguous_memory_optimization", "synchronize_checkpoint_boundary", "profile"})
      if (a.get_bool(k).value_or(false)) inert.push_back(std::string("activation_checkpointing.") + k);
    if (auto n = a.get_int("number_checkpoints"); n && *n != cfg.model.num_layers && *n > 0)
      inert.push_back("activation_checkpointing.number_checkpoints");
    a.finish();
    cfg.recompute_activations = true;
    cfg.notes.push_back("ds_config activation_checkpointing: every layer is recomputed in backward (as --checkpoint-activations)");
    if (!inert.empty())
      note(joined(inert), "each layer keeps its input only, whole on every tensor-parallel rank, in the model's own memory");
  }
  if (root.has("checkpoint")) {
    JsonSection c = root.section("checkpoint");
    std::vector<std::string> given;
    for (const char* k : {"tag_validation", "load_universal", "use_node_local_storage", "parallel_write"})
      if (j["checkpoint"].contains(k)) given.push_back(std::string("checkpoint.") + k), c.ignore(k);
    c.finish();
    if (!given.empty())
      note(joined(given), "a checkpoint is one HDF5 file written collectively, checked by checksums on load, and loads at any "
                          "layout (universal) on any ranks");
  }
  if (root.has("data_types")) {
    JsonSection d = root.section("data_types");
    if (auto t = d.get_string("grad_accum_dtype"); t && *t != "fp32")
      throw Error("data_types.grad_accum_dtype '" + *t + "' is not implemented",
                  Error::Context{root.file(), "data_types.grad_accum_dtype", "gradients accumulate in fp32 here: give fp32"});
    d.finish();
  }
  if (auto f = root.get_number("gradient_predivide_factor")) {
    if (!(*f > 0))
      throw Error("'gradient_predivide_factor' must be positive", Error::Context{root.file(), "gradient_predivide_factor", ""});
    if (*f != 1.0) note("gradient_predivide_factor", "gradients are summed in fp32 and scaled once by the global batch (the factor only moves a division)");
  }
  if (auto m = root.get_bool("memory_breakdown"); m && *m)
    note("memory_breakdown", "the model states per rank are printed at the start and the peak resident memory at the end");
  // The profilers and network monitors: off unless "enabled": true, as DeepSpeed's defaults. Their
  // fields (output files, project names, keys) are all accepted: none of them is acted on here.
  const char* local = "nothing is sent over the network; tensorboard and csv_monitor write the same scalars to local files";
  const std::pair<const char*, const char*> monitors[] = {
      {"flops_profiler", "every log line has the step's TFLOPs from the model's FLOP count (Megatron's formula); no "
                         "per-module profile is printed"},
      {"comms_logger", "the data-parallel, tensor-parallel and MoE traffic per step is printed at the end of the run; "
                       "collectives are not timed one by one"},
      {"wandb", local},
      {"comet", local}};
  for (const auto& [k, why] : monitors) {
    if (!root.has(k)) continue;
    root.ignore(k);
    if (enabled(j, k)) note(k, why);
  }
}

}  // namespace hpct::engine::detail
