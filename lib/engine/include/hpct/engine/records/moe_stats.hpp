// hpct/engine/records/moe_stats.hpp — one optimizer step's MoE routing record, agreed over the ranks.
//
// The model counts, per MoE layer, what its rank's tokens did (routes kept per expert, routes
// dropped, aux and z losses per micro-batch); this sums them over the dense data-parallel group,
// so every rank holds the step's global figures: the "moe loss" of Megatron-DeepSpeed's log line
// (coefficient x the layers' aux losses, averaged over the global batch's micro-batches, plus the
// z-loss term) and, for the metrics file, each layer's expert load and dropped fraction.
#pragma once
#include <nlohmann/json.hpp>

#include "hpct/comm/mpi.hpp"
#include "hpct/model/gpt.hpp"

namespace hpct::engine {

struct MoeStepStats {
  double moe_loss = 0;  // loss_coeff * sum_layers mean(aux) + z_loss_coeff * sum_layers mean(z)
  nlohmann::json layers = nlohmann::json::array();  // [{layer, experts, load: [...], dropped_fraction, aux_loss, z_loss}]
};

/// Collective over dp (every rank of the dense data-parallel group). Reads and resets the model's
/// counters. Returns an empty record for a dense model.
MoeStepStats gather_moe_stats(model::Gpt& model, const comm::Communicator& dp);

}  // namespace hpct::engine
