// Memory planning for ZeRO stages and offload choices: the formulas of docs/zero.md
// ("Planning memory"), evaluated in exact integer bytes.
#include "hpct/parallel/memory_estimate.hpp"

#include <sys/statvfs.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "hpct/core/error.hpp"

namespace hpct::parallel {
namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

double gb(uint64_t bytes) { return (double)bytes / 1e9; }

std::string gb_text(uint64_t bytes) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed << gb(bytes) << " GB";
  return os.str();
}

// LoRA: what trains is the adapters (lib/model/src/gpt_layout.cpp: a "layers.<l>.lora" block per
// layer, an "embedding.lora" block) and the modules to save; the rest of s's base is frozen.
// (validate() refuses LoRA with MoE, so s counts the dense model: this tensor-parallel rank's part,
// and in whole_model the whole base.) Under tensor parallelism the adapters split with their
// linears: a column-parallel linear's B, a row-parallel one's A and the embedding's A are 1/T.
void count_lora(const model::GptConfig& cfg, GptSize& s) {
  using model::LoraConfig;
  const LoraConfig& lo = cfg.lora;
  const uint64_t C = (uint64_t)cfg.hidden_size, F = (uint64_t)cfg.ffn(), Vp = (uint64_t)cfg.padded_vocab();
  const uint64_t r = (uint64_t)lo.rank, P = (uint64_t)cfg.tensor_parallel;
  const uint64_t G = cfg.mlp == model::MlpKind::swiglu ? 2 * F : F;  // fc's output: SwiGLU's [gate | up]
  const uint64_t in[4] = {C, C, C, F}, out[4] = {3 * C, C, G, C};  // qkv, proj, fc, fc2
  const bool column[4] = {true, false, true, false};
  uint64_t layer_adapters = 0, whole_layer = 0;
  for (int t = 0; t < 4; ++t)
    if (lo.adapts(t)) {  // A (rank, in) + B (out, rank)
      layer_adapters += r * (column[t] ? in[t] + out[t] / P : in[t] / P + out[t]);
      whole_layer += r * (in[t] + out[t]);
    }
  const bool emb_lora = lo.adapts(LoraConfig::embedding);
  const uint64_t emb_adapters = emb_lora ? r * (Vp / P + C) : 0;  // A (Vp, rank) + B (C, rank)
  const uint64_t norm = lo.saves(LoraConfig::final_layernorm) ? s.final_norm : 0;
  const uint64_t emb = lo.saves(LoraConfig::embeddings) ? s.embedding : 0;
  const uint64_t pos = lo.own_position_block() ? (uint64_t)cfg.positions() * C : 0;  // wpe (T, C), a block apart
  const uint64_t base = s.params, adapters = layer_adapters * (uint64_t)cfg.num_layers + emb_adapters;
  s.frozen = base - norm - emb - pos;
  // the embedding is held from the input to the head; with it a layer, or at the end an untied head
  s.frozen_working = (emb ? 0 : s.embedding - pos) + std::max(s.layer, s.output_layer);
  s.params = s.dense = adapters + norm + emb + pos;
  model::GptConfig one = cfg;  // whole_model counts the model at T = 1 (its padded vocabulary)
  one.tensor_parallel = 1;
  s.whole_model += whole_layer * (uint64_t)cfg.num_layers + (emb_lora ? r * ((uint64_t)one.padded_vocab() + C) : 0);
  s.largest_block = 0;
  for (auto [n, name] : {std::pair{layer_adapters, "layer adapters"}, {emb_adapters, "embedding adapters"},
                         {emb, "embedding"}, {pos, "position embedding"}, {norm, "final norm"}})
    if (n > s.largest_block) s.largest_block = n, s.largest_block_name = name;
  s.largest_dense_block = s.largest_block;
}

}  // namespace

GptSize gpt_size(const model::GptConfig& cfg, int expert_parallel) {
  cfg.validate();
  const uint64_t C = (uint64_t)cfg.hidden_size, F = (uint64_t)cfg.ffn();
  const uint64_t T = (uint64_t)cfg.positions(), Vp = (uint64_t)cfg.padded_vocab();
  const uint64_t P = (uint64_t)cfg.tensor_parallel;  // divides heads, hence C, F and Vp (validated)
  if (expert_parallel < 1)
    throw config_error("--moe-expert-parallel-size", "--moe-expert-parallel-size must be at least 1");
  GptSize s;
  s.tensor_parallel = cfg.tensor_parallel;
  s.expert_parallel = expert_parallel;
  s.embedding = Vp / P * C + (cfg.rotary ? 0 : T * C);  // wte (Vp/P, C); wpe (T, C) whole, none with rotary positions
  const uint64_t norm = cfg.normalization == model::NormKind::layernorm ? 2 * C : C;  // weight (and bias)
  const uint64_t G = cfg.mlp == model::MlpKind::swiglu ? 2 * F : F;  // fc's rows: SwiGLU's gate and up
  const uint64_t b = cfg.linear_bias ? 1 : 0;  // --disable-bias-linear: no qkv, dense, fc, fc2 biases
  const uint64_t Q = C + 2 * (uint64_t)cfg.kv_heads() * (C / cfg.num_heads);  // qkv rows (grouped: fewer k, v)
  // ln1 + qkv (3C*C + 3C)/P + proj C*C/P + C + ln2 + fc (G*C + G)/P + fcproj C*F/P + C (the
  // biases: the b terms)
  s.layer = (Q * C + C * C + b * Q + G * C + b * G + C * F) / P + b * 2 * C + 2 * norm;
  s.final_norm = norm;
  s.output_layer = cfg.untie_embeddings ? Vp / P * C : 0;
  // An MoE layer: the attention and norms, the router (E, C) whole, a residual MoE's dense MLP and
  // coefficient (2C + 2); each expert fc (G*C + G) + fcproj (C*F) + C, split like the MLP with
  // expert tensor parallelism.
  const uint64_t attention = (Q * C + C * C + b * Q) / P + b * C + 2 * norm, mlp = (G * C + b * G + C * F) / P + b * C;
  s.expert = cfg.moe.expert_tensor_parallel ? mlp : G * C + b * G + C * F + b * C;
  s.dense = s.embedding + s.final_norm + s.output_layer;
  uint64_t largest_moe = 0;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const int E = cfg.moe.experts_of(l, cfg.num_layers);
    if (E == 0) {
      s.dense += s.layer;
      continue;
    }
    if (E % expert_parallel != 0)
      throw config_error("--moe-expert-parallel-size",
                         "--moe-expert-parallel-size " + std::to_string(expert_parallel) + " does not divide the " +
                             std::to_string(E) + " experts of layer " + std::to_string(l + 1),
                         "choose an expert-parallel size that divides every --num-experts entry");
    const uint64_t moe = attention + (uint64_t)E * C + (cfg.moe.residual ? mlp + 2 * C + 2 : 0);
    s.dense += moe;
    s.experts += (uint64_t)(E / expert_parallel) * s.expert;
    s.moe_layer = moe;
    largest_moe = std::max(largest_moe, moe);
    ++s.moe_layers;
  }
  s.params = s.dense + s.experts;
  s.largest_block = s.embedding;
  s.largest_block_name = "embedding";
  const bool dense_layers = s.moe_layers < cfg.num_layers;
  for (auto [n, name] : {std::pair{dense_layers ? s.layer : 0, "layer"}, {largest_moe, "moe layer"},
                         {s.moe_layers ? s.expert : 0, "expert"}, {s.output_layer, "output layer"}})
    if (n > s.largest_block) s.largest_block = n, s.largest_block_name = name;
  s.largest_dense_block = std::max({s.embedding, dense_layers ? s.layer : 0, largest_moe, s.output_layer});
  if (P == 1 && expert_parallel == 1 && !cfg.moe.expert_tensor_parallel) {
    s.whole_model = s.params;
  } else {
    model::GptConfig whole = cfg;
    whole.tensor_parallel = 1;
    whole.moe.expert_tensor_parallel = false;
    whole.lora = model::LoraConfig{};  // the base: count_lora adds the whole adapters
    s.whole_model = gpt_size(whole, 1).params;
  }
  if (cfg.lora.enabled()) count_lora(cfg, s);
  return s;
}

StateBytes state_bytes(StatePrecision p) {
  return p == StatePrecision::mixed ? StateBytes{2, 2, 12} : StateBytes{4, 4, 8};
}

const char* precision_name(StatePrecision p) { return p == StatePrecision::mixed ? "mixed" : "fp32"; }

const char* offload_name(Offload o) {
  switch (o) {
    case Offload::none: return "none";
    case Offload::optimizer_cpu: return "optimizer:cpu";
    case Offload::optimizer_nvme: return "optimizer:nvme";
    case Offload::optimizer_param_cpu: return "optimizer+param:cpu";
    case Offload::optimizer_param_nvme: return "optimizer+param:nvme";
  }
  return "?";
}

bool offload_allowed(int stage, Offload o) {
  if (stage < 0 || stage > 3) return false;
  switch (o) {
    case Offload::none: return true;
    case Offload::optimizer_cpu: return stage >= 1;
    default: return stage == 3;
  }
}

void ClusterShape::validate() const {
  if (nodes <= 0) throw config_error("--estimate-nodes", "--estimate-nodes must be positive");
  if (devices_per_node <= 0) throw config_error("--estimate-gpus-per-node", "--estimate-gpus-per-node must be positive");
  if (host_bytes == 0)
    throw config_error("--estimate-cpu-memory", "--estimate-cpu-memory must be positive (GB of CPU memory per node)");
}

ClusterShape local_cluster_shape(int ranks, const std::string& nvme_path) {
  ClusterShape c;
  c.nodes = 1;
  c.devices_per_node = ranks;
  c.device_bytes = 0;  // CPU backend: ranks are host processes
  std::ifstream f("/proc/meminfo");
  if (!f) throw file_error("/proc/meminfo", "cannot read the host memory size", "give --estimate-cpu-memory GB");
  std::string key;
  uint64_t kb = 0;
  while (f >> key >> kb) {
    if (key == "MemTotal:") {
      c.host_bytes = kb * 1024;
      break;
    }
    f.ignore(1 << 20, '\n');
  }
  if (c.host_bytes == 0) throw file_error("/proc/meminfo", "no MemTotal line", "give --estimate-cpu-memory GB");
  struct statvfs vfs {};
  if (statvfs(nvme_path.c_str(), &vfs) == 0) c.nvme_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize;
  return c;
}

std::string MemoryPlan::fit_text() const {
  if (fits()) return "yes";
  std::string s;
  for (auto [bad, name] : {std::pair{!fits_device, "device"}, {!fits_host, "host"}, {!fits_nvme, "nvme"}})
    if (bad) s += (s.empty() ? "" : ", ") + std::string(name);
  return "no (" + s + ")";
}

MemoryPlan plan_memory(const GptSize& size, StatePrecision prec, int stage, Offload o, const ClusterShape& c,
                       const BufferModel& b) {
  if (stage < 0 || stage > 3) throw config_error("--zero-stage", "ZeRO stage must be 0, 1, 2 or 3");
  if (!offload_allowed(stage, o))
    throw config_error("offload", std::string("offload ") + offload_name(o) + " is not available with ZeRO stage " +
                                      std::to_string(stage),
                       "optimizer offload to CPU needs stage 1-3; NVMe and parameter offload need stage 3");
  const StateBytes sb = state_bytes(prec);
  const uint64_t T = (uint64_t)std::max(1, size.tensor_parallel);
  if (c.devices() % T != 0)
    throw config_error("--tensor-model-parallel-size", std::to_string(c.devices()) + " devices do not divide into tensor-parallel groups of " +
                                                           std::to_string(T),
                       "choose a tensor-parallel size that divides the devices");
  // Ψ is one tensor-parallel rank's share; ZeRO partitions it over the data-parallel ranks, its
  // experts over the expert-data-parallel ranks (N / EP).
  const uint64_t psi = size.params, N = (uint64_t)c.devices() / T, B = size.largest_block;
  const uint64_t EP = (uint64_t)std::max(1, size.expert_parallel);
  if (size.experts > 0 && N % EP != 0)
    throw config_error("--moe-expert-parallel-size", std::to_string(N) + " data-parallel ranks (devices / T) do not divide into "
                                                       "expert-parallel groups of " + std::to_string(EP),
                       "choose an expert-parallel size that divides devices / tensor-parallel size");
  // One ZeRO engine per group (dense; experts), each with its own buffers.
  struct Group {
    uint64_t psi, n, block;
  };
  std::vector<Group> groups = {{psi - size.experts, N, size.experts ? size.largest_dense_block : B}};
  if (size.experts) groups.push_back({size.experts, N / EP, size.expert});
  uint64_t part = 0;
  for (const Group& g : groups) part += ceil_div(g.psi, g.n);
  const std::string p = std::to_string(sb.param), g = std::to_string(sb.grad), k = std::to_string(sb.optimizer);
  // What the CPU step reads and writes per partitioned parameter: the fp32 optimizer arrays
  // (master, m, v: 12 bytes in both precisions, since in fp32 training the device keeps its own
  // working copy and the master is a second one) and an fp32 gradient (4). NVMe takes the three
  // optimizer arrays (io::SwapStore with K = 3); the gradient stays in host memory.
  const uint64_t opt_arrays = 12, host_grad = 4;
  // Parameter offload moves the 16-bit working partition too; in fp32 the master is that copy.
  const uint64_t host_param = prec == StatePrecision::mixed ? sb.param : 0;
  uint64_t bucket = 0, regather = 0, gathered = 0, opt_swap = 0, param_swap = 0;
  for (const Group& g : groups) {
    // Stage 2: a gradient bucket of reduce_bucket_size elements, at least one block, at most Ψ.
    // (GPU-resident stage 1 too: its reduce-scatters through NCCL are under way beside the backward
    // from padded copies of the 16-bit gradient.)
    bucket += sb.grad * std::max(g.block, std::min(b.reduce_bucket_elems, g.psi));
    // GPU-resident stages 1-2: the parameter all-gathers after a step, under way beside the next
    // forward, each into a buffer of its block (parallel::DeviceEngine).
    regather += sb.param * std::max(g.block, std::min(b.allgather_bucket_elems, g.psi));
    // Stage 3: live_blocks gathered blocks + the prefetch, and one block's gradient before its
    // reduce-scatter (never more than the whole group: a small model is simply gathered whole).
    gathered += sb.param * std::min((uint64_t)b.live_blocks * g.block + std::min(b.prefetch_elems, g.psi), g.psi) +
                sb.grad * g.block;
    // NVMe optimizer: buffer_count slots, each one tile of the 3 fp32 arrays (docs/offload.md).
    opt_swap += (uint64_t)b.optimizer_swap_buffers * 3 * 4 * std::min(b.optimizer_tile_elems, ceil_div(g.psi, g.n));
    // NVMe params: staging slices of a block (each rank reads its 1/N of a block, then all-gathers).
    param_swap += (uint64_t)b.param_swap_buffers * ceil_div(g.block, g.n) * sb.param;
  }

  MemoryPlan m;
  m.stage = stage;
  m.offload = o;
  if (o == Offload::none) {
    switch (stage) {
      case 0:
        m.device_states = (sb.param + sb.grad + sb.optimizer) * psi;
        m.formula = "(" + p + "+" + g + "+" + k + ")P";
        break;
      case 1:
        // The full gradient, and the reduced partition the optimizer reads in an array of its own
        // (zero.cpp): the ZeRO paper's (2+2)Ψ + KΨ/N leaves that partition out.
        m.device_states = (sb.param + sb.grad) * psi + (sb.grad + sb.optimizer) * part;
        if (!c.devices_in_host_memory()) m.device_buffers = bucket + regather;
        m.formula = "(" + p + "+" + g + ")P + (" + g + "+" + k + ")P/N";
        break;
      case 2:
        m.device_states = sb.param * psi + (sb.grad + sb.optimizer) * part;
        m.device_buffers = bucket + (c.devices_in_host_memory() ? 0 : regather);
        m.formula = p + "P + (" + g + "+" + k + ")P/N";
        break;
      default:
        m.device_states = (sb.param + sb.grad + sb.optimizer) * part;
        m.device_buffers = gathered;
        m.formula = "(" + p + "+" + g + "+" + k + ")P/N";
    }
  } else if (o == Offload::optimizer_cpu || o == Offload::optimizer_nvme) {
    // Gradients leave the device as they are reduced (stage 2/3); stage 1 keeps the full gradient.
    // On GPUs stage 2 keeps it too: ZeRO-Offload's device store sums the step's gradient there and
    // hands it to the host once per step (parallel::DeviceStore), DeepSpeed's 2Ψ plus 2Ψ.
    if (stage == 1 || (stage == 2 && !c.devices_in_host_memory())) {
      m.device_states = (sb.param + sb.grad) * psi;
      m.formula = "(" + p + "+" + g + ")P";
    } else if (stage == 2) {
      m.device_states = sb.param * psi;
      m.device_buffers = bucket;
      m.formula = p + "P";
    } else {
      m.device_states = sb.param * part;
      m.device_buffers = gathered;
      m.formula = p + "P/N";
    }
    if (o == Offload::optimizer_cpu) {
      m.host_states_per_rank = (opt_arrays + host_grad) * part;
    } else {
      m.nvme_per_rank = opt_arrays * part;
      m.host_states_per_rank = host_grad * part;
      m.host_buffers_per_rank = opt_swap;
    }
  } else {  // parameters and optimizer off the device (stage 3): only gathered blocks remain
    m.device_buffers = gathered;
    m.formula = "0";
    if (o == Offload::optimizer_param_cpu) {
      m.host_states_per_rank = (opt_arrays + host_grad + host_param) * part;
    } else {
      m.nvme_per_rank = (opt_arrays + host_param) * part;
      m.host_states_per_rank = host_grad * part;
      m.host_buffers_per_rank = opt_swap + param_swap;
    }
  }

  if (size.frozen > 0) {  // LoRA's frozen base: whole on every rank, widened while in use in 16-bit runs
    const uint64_t f = sb.param * size.frozen;
    if (o == Offload::optimizer_param_cpu || o == Offload::optimizer_param_nvme) {
      m.host_states_per_rank += f;  // the device formula stays "0"
    } else {
      m.device_states += f;
      m.formula += " + " + p + "F";
    }
    if (prec == StatePrecision::mixed) m.device_buffers += 4 * size.frozen_working;
  }
  const uint64_t gpn = (uint64_t)c.devices_per_node;
  m.host_per_node = gpn * (m.host_states_per_rank + m.host_buffers_per_rank);
  if (c.devices_in_host_memory()) m.host_per_node += gpn * m.device_total();
  m.nvme_per_node = gpn * m.nvme_per_rank;
  m.fits_device = c.devices_in_host_memory() || m.device_total() <= c.device_bytes;
  m.fits_host = m.host_per_node <= c.host_bytes;
  m.fits_nvme = m.nvme_per_node <= c.nvme_bytes;

  // DeepSpeed's estimators (estimate_zero2/zero3_model_states_mem_needs in its stage_1_and_2.py and
  // stage3.py, with zero_init and the 1.5 buffer factor), written for 16-bit training; shown beside
  // ours, not used for the verdicts.
  if (prec == StatePrecision::mixed && size.experts == 0 && size.frozen == 0) {  // they know no experts or frozen base
    const double P = (double)psi, n = (double)N, L4 = 4.0 * (double)B, gp = (double)c.devices_per_node;
    if (stage == 2 && o == Offload::none) {
      m.ds_device = 4 * P + 16 * P / n;
      m.ds_host_per_node = 4 * P * gp * 1.5;
    } else if (stage == 2 && o == Offload::optimizer_cpu) {
      m.ds_device = 2 * P;
      m.ds_host_per_node = P * std::max(4 * n, 16.0) * 1.5;
    } else if (stage == 3 && o == Offload::none) {
      m.ds_device = L4 + 18 * P / n;
      m.ds_host_per_node = (double)B * 4 * gp * 1.5;
    } else if (stage == 3 && o == Offload::optimizer_cpu) {
      m.ds_device = L4 + 2 * P / n;
      m.ds_host_per_node = 16 * P / c.nodes * 1.5;
    } else if (stage == 3 && o == Offload::optimizer_param_cpu) {
      m.ds_device = L4;
      m.ds_host_per_node = 18 * P / c.nodes * 1.5;
    }
  }
  return m;
}

MemoryEstimate estimate_memory(const model::GptConfig& cfg, StatePrecision p, const ClusterShape& c,
                               const BufferModel& b, int expert_parallel) {
  c.validate();
  MemoryEstimate e;
  e.model = cfg;
  e.size = gpt_size(cfg, expert_parallel);
  e.precision = p;
  e.cluster = c;
  e.buffers = b;
  for (int stage = 0; stage <= 3; ++stage)
    for (Offload o : {Offload::none, Offload::optimizer_cpu, Offload::optimizer_nvme, Offload::optimizer_param_cpu,
                      Offload::optimizer_param_nvme})
      if (offload_allowed(stage, o)) e.plans.push_back(plan_memory(e.size, p, stage, o, c, b));
  return e;
}

ReportTable MemoryEstimate::table() const {
  ReportTable t({{"stage", ""},
                 {"offload", ""},
                 {"device_formula", ""},
                 {"device_states", "GB", 2},
                 {"device_buffers", "GB", 2},
                 {"device_total", "GB", 2},
                 {"host_per_node", "GB", 2},
                 {"nvme_per_node", "GB", 2},
                 {"fits", ""},
                 {"ds_device", "GB", 2},
                 {"ds_host_per_node", "GB", 2}});
  auto opt = [](double v) -> ReportTable::Cell { return v < 0 ? ReportTable::Cell{} : ReportTable::Cell{v / 1e9}; };
  for (const auto& m : plans)
    t.add_row({(int64_t)m.stage, std::string(offload_name(m.offload)), m.formula, gb(m.device_states),
               gb(m.device_buffers), gb(m.device_total()), gb(m.host_per_node), gb(m.nvme_per_node), m.fit_text(),
               opt(m.ds_device), opt(m.ds_host_per_node)});
  return t;
}

std::string MemoryEstimate::header_text() const {
  const StateBytes sb = state_bytes(precision);
  std::ostringstream os;
  os << "# model: " << model.describe() << "\n"
     << "# parameters: Ψ = " << size.params
     << (size.tensor_parallel > 1 ? " per tensor-parallel rank (T = " + std::to_string(size.tensor_parallel) + ")" : std::string())
     << " (embedding " << size.embedding << ", per layer " << size.layer
     << ", largest block: " << size.largest_block_name << " " << size.largest_block << ")\n";
  if (size.frozen > 0)
    os << "# LoRA: Ψ counts what trains (rank " << model.lora.rank << " adapters on " << model.lora.target_list()
       << (model.lora.modules_to_save ? ", and " + model.lora.module_list() + " in full" : std::string())
       << "); the frozen base, F = " << size.frozen << " parameters, is held whole by every rank in the working "
       << "precision, and in 16-bit runs up to " << size.frozen_working
       << " of them at once are widened to fp32 (counted with the buffers); the whole model " << size.whole_model
       << " parameters\n";
  if (size.moe_layers > 0)
    os << "# MoE: " << size.moe_layers << " MoE layers, expert-parallel size " << size.expert_parallel
       << (model.moe.expert_tensor_parallel ? ", experts tensor-parallel" : "") << "; Ψ = dense " << size.dense
       << " + this rank's experts " << size.experts << " (" << size.expert << " each); the whole model "
       << size.whole_model << " parameters\n";
  os
     << "# precision: " << precision_name(precision) << ", bytes per parameter: params " << sb.param << " + grads "
     << sb.grad << " + optimizer K=" << sb.optimizer << "\n"
     << "# cluster: " << cluster.nodes << " node(s) x " << cluster.devices_per_node << " device(s) = N "
     << cluster.devices() << "; device memory "
     << (cluster.devices_in_host_memory() ? std::string("shared with the host (ranks are host processes)")
                                          : gb_text(cluster.device_bytes))
     << "; CPU memory per node " << gb_text(cluster.host_bytes) << "; NVMe per node " << gb_text(cluster.nvme_bytes)
     << "\n"
     << "# buffers: stage 2 one gradient bucket of max(largest block, min(" << buffers.reduce_bucket_elems
     << ", Ψ)) elements (on GPUs stage 1 too, and at stages 1-2 the parameters of max(largest block, min("
     << buffers.allgather_bucket_elems << ", Ψ)) elements being all-gathered); stage 3 " << buffers.live_blocks << " gathered blocks + prefetch of min("
     << buffers.prefetch_elems << ", Ψ) elements + one block's gradient; NVMe optimizer swap "
     << buffers.optimizer_swap_buffers << " slots x 3 fp32 tiles of " << buffers.optimizer_tile_elems
     << " elements; NVMe params " << buffers.param_swap_buffers
     << " staging slices per rank\n"
     << "# device_formula: model states on one device; P = Ψ parameters, N = devices"
     << (size.tensor_parallel > 1 ? " / T (the data-parallel ranks)" : "")
     << (size.experts > 0 ? "; P/N = dense/N + experts/(N/EP) (experts sharded over the expert-data-parallel ranks)" : "")
     << (size.frozen > 0 ? "; F = the frozen base" : "") << ".\n"
     << "# not counted: activations, communication-library buffers, fragmentation. GB = 1e9 bytes.\n"
     << "# ds_*: DeepSpeed's own estimators for comparison (16-bit training only); we plan with ours.\n";
  return os.str();
}

nlohmann::json MemoryEstimate::json() const {
  const StateBytes sb = state_bytes(precision);
  nlohmann::json plans_json = nlohmann::json::array();
  for (const auto& m : plans) {
    nlohmann::json ds = nullptr;
    if (m.ds_device >= 0)
      ds = {{"device", m.ds_device}, {"host_per_node", m.ds_host_per_node < 0 ? nlohmann::json(nullptr) : nlohmann::json(m.ds_host_per_node)}};
    plans_json.push_back({{"stage", m.stage},
                          {"offload", offload_name(m.offload)},
                          {"device_formula", m.formula},
                          {"device_states", m.device_states},
                          {"device_buffers", m.device_buffers},
                          {"device_total", m.device_total()},
                          {"host_states_per_rank", m.host_states_per_rank},
                          {"host_buffers_per_rank", m.host_buffers_per_rank},
                          {"host_per_node", m.host_per_node},
                          {"nvme_per_rank", m.nvme_per_rank},
                          {"nvme_per_node", m.nvme_per_node},
                          {"fits_device", m.fits_device},
                          {"fits_host", m.fits_host},
                          {"fits_nvme", m.fits_nvme},
                          {"fits", m.fits()},
                          {"deepspeed_estimate", ds}});
  }
  return {{"model",
           {{"num_layers", model.num_layers},
            {"hidden_size", model.hidden_size},
            {"num_attention_heads", model.num_heads},
            {"num_key_value_heads", model.kv_heads()},
            {"ffn_hidden_size", model.ffn()},
            {"normalization", model::norm_name(model.normalization)},
            {"swiglu", model.mlp == model::MlpKind::swiglu},
            {"add_bias_linear", model.linear_bias},
            {"untie_embeddings_and_output_weights", model.untie_embeddings},
            {"position_embedding_type", model.rotary ? "rope" : "learned_absolute"},
            {"seq_length", model.max_seq_length},
            {"max_position_embeddings", model.positions()},
            {"vocab_size", model.vocab_size},
            {"padded_vocab_size", model.padded_vocab()},
            {"tensor_model_parallel_size", size.tensor_parallel},
            {"params", size.params},
            {"dense_params", size.dense},
            {"expert_params", size.experts},
            {"expert_parallel_size", size.expert_parallel},
            {"moe_layers", size.moe_layers},
            {"expert_block_params", size.expert},
            {"whole_model_params", size.whole_model},
            {"frozen_params", size.frozen},
            {"frozen_working_params", size.frozen_working},
            {"embedding_params", size.embedding},
            {"layer_params", size.layer},
            {"final_norm_params", size.final_norm},
            {"largest_block", size.largest_block_name},
            {"largest_block_params", size.largest_block}}},
          {"precision", {{"name", precision_name(precision)}, {"param_bytes", sb.param}, {"grad_bytes", sb.grad},
                         {"optimizer_bytes", sb.optimizer}}},
          {"cluster", {{"nodes", cluster.nodes},
                       {"devices_per_node", cluster.devices_per_node},
                       {"devices", cluster.devices()},
                       {"device_bytes", cluster.device_bytes},
                       {"devices_in_host_memory", cluster.devices_in_host_memory()},
                       {"host_bytes_per_node", cluster.host_bytes},
                       {"nvme_bytes_per_node", cluster.nvme_bytes}}},
          {"buffers", {{"reduce_bucket_elems", buffers.reduce_bucket_elems},
                       {"allgather_bucket_elems", buffers.allgather_bucket_elems},
                       {"prefetch_elems", buffers.prefetch_elems},
                       {"live_blocks", buffers.live_blocks},
                       {"optimizer_tile_elems", buffers.optimizer_tile_elems},
                       {"optimizer_swap_buffers", buffers.optimizer_swap_buffers},
                       {"param_swap_buffers", buffers.param_swap_buffers}}},
          {"plans", plans_json}};
}

}  // namespace hpct::parallel
