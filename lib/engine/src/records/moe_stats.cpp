// One step's MoE routing record. See moe_stats.hpp.
#include "hpct/engine/records/moe_stats.hpp"

namespace hpct::engine {

MoeStepStats gather_moe_stats(model::Gpt& model, const comm::Communicator& dp) {
  MoeStepStats out;
  const auto& st = model.moe_stats();
  if (st.empty()) return out;
  // One flat vector per step: per layer [micro_batches, routes, dropped, aux, z, load...].
  std::vector<double> v;
  for (const auto& s : st) {
    v.insert(v.end(), {double(s.micro_batches), double(s.routes), double(s.dropped), s.aux_loss, s.z_loss});
    for (long long x : s.load) v.push_back(double(x));
  }
  dp.allreduce_sum(v.data(), v.size());
  const auto& moe = model.config().moe;
  size_t at = 0;
  int moe_index = 0;
  for (const auto& s : st) {
    const double mbs = v[at], routes = v[at + 1], dropped = v[at + 2], aux = v[at + 3], z = v[at + 4];
    at += 5;
    nlohmann::json load = nlohmann::json::array();
    for (size_t e = 0; e < s.load.size(); ++e) load.push_back(static_cast<long long>(v[at + e]));
    at += s.load.size();
    const double mean_aux = mbs > 0 ? aux / mbs : 0, mean_z = mbs > 0 ? z / mbs : 0;
    out.moe_loss += moe.loss_coeff * mean_aux + moe.z_loss_coeff * mean_z;
    out.layers.push_back({{"moe_layer", moe_index++},
                          {"experts", s.load.size()},
                          {"load", load},
                          {"dropped_fraction", routes > 0 ? dropped / routes : 0.0},
                          {"aux_loss", mean_aux},
                          {"z_loss", mean_z}});
  }
  model.reset_moe_stats();
  return out;
}

}  // namespace hpct::engine
