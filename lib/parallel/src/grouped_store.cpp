// One ZeRO engine per reducing group. See grouped_store.hpp.
#include "hpct/parallel/grouped_store.hpp"

#include <algorithm>

#include "hpct/core/error.hpp"

namespace hpct::parallel {

GroupedStore::GroupedStore(const ParamLayout& schema, std::vector<StoreGroup> groups, const ZeroConfig& cfg,
                           kernels::Precision precision, const comm::Communicator* across,
                           const comm::Communicator* tp, const EngineFactory& make,
                           kernels::OpsBackend* frozen_memory)
    : schema_(schema), across_(across), tp_(tp && tp->size() > 1 ? tp : nullptr) {
  route_.assign(schema.blocks().size(), Route{});
  for (auto& g : groups) {
    if (g.frozen) {
      if (frozen_) throw Error("GroupedStore: two frozen groups");
      for (size_t i = 0; i < g.blocks.size(); ++i) {
        const int b = g.blocks[i];
        if (route_[b].engine != -1) throw Error("GroupedStore: block " + schema.blocks()[b].name + " is in two groups");
        route_[b] = Route{kFrozen, static_cast<int>(i)};
      }
      if (!frozen_memory) frozen_memory = (host_ = kernels::cpu_ops()).get();
      frozen_ = std::make_unique<FrozenBlocks>(schema, g.blocks, precision, *frozen_memory);
      continue;
    }
    if (!g.comm) throw Error("GroupedStore: a group without a communicator");
    Part p;
    p.spec = std::move(g);
    p.layout = std::make_unique<ParamLayout>(schema.subset(p.spec.blocks));
    const int e = static_cast<int>(parts_.size());
    for (size_t i = 0; i < p.spec.blocks.size(); ++i) {
      const int b = p.spec.blocks[i];
      if (route_[b].engine != -1) throw Error("GroupedStore: block " + schema.blocks()[b].name + " is in two groups");
      route_[b] = Route{e, static_cast<int>(i)};
    }
    parts_.push_back(std::move(p));
  }
  if (parts_.empty()) throw Error("GroupedStore: no group");
  // Engines last: each is collective over its communicator, in the order the groups were given.
  for (auto& p : parts_)
    p.engine = make ? make(*p.layout, p.spec)
                    : std::make_unique<ZeroEngine>(*p.layout, cfg, *p.spec.comm, precision, p.spec.swap_tag);
}

GroupedStore::~GroupedStore() = default;

const GroupedStore::Route& GroupedStore::at(int block) const {
  if (block < 0 || block >= static_cast<int>(route_.size()) || route_[block].engine == -1)
    throw Error("GroupedStore: this rank does not hold block " + std::to_string(block));
  return route_[block];
}

const float* GroupedStore::params(int block) {
  const Route& r = at(block);
  if (r.engine != kFrozen) return parts_[r.engine].engine->params(r.local);
  return frozen_->params(r.local);
}
float* GroupedStore::grads(int block) {
  const Route& r = at(block);
  return r.engine == kFrozen ? nullptr : parts_[r.engine].engine->grads(r.local);
}
void GroupedStore::release(int block) {
  const Route& r = at(block);
  if (r.engine == kFrozen) frozen_->release(r.local);
  else parts_[r.engine].engine->release(r.local);
}
const uint16_t* GroupedStore::params_half(int block) {
  const Route& r = at(block);
  if (r.engine == kFrozen) return frozen_->params_half(r.local);
  return parts_[r.engine].engine->params_half(r.local);
}
const uint16_t* GroupedStore::params16(int block) {
  const Route& r = at(block);
  if (r.engine == kFrozen) return frozen_->params_half(r.local);  // the frozen blocks live in the model's backend
  return parts_[r.engine].engine->params16(r.local);
}
void GroupedStore::grads_ready(int block) {
  const Route& r = at(block);
  if (r.engine != kFrozen) parts_[r.engine].engine->grads_ready(r.local);
}

void GroupedStore::grads_ready_half(int block, const uint16_t* g, size_t n, kernels::Precision p) {
  const Route& r = at(block);
  if (r.engine != kFrozen) parts_[r.engine].engine->grads_ready_half(r.local, g, n, p);
}

void GroupedStore::init_params(const std::function<void(int block, float* dst)>& init) {
  for (auto& p : parts_) p.engine->init_params([&](int local, float* dst) { init(p.spec.blocks[local], dst); });
  if (frozen_) frozen_->init(init);
}
void GroupedStore::begin_step() {
  for (auto& p : parts_) p.engine->begin_step();
}
void GroupedStore::begin_micro_step(bool last) {
  for (auto& p : parts_) p.engine->begin_micro_step(last);
}
void GroupedStore::end_micro_step() {
  for (auto& p : parts_) p.engine->end_micro_step();
}

double GroupedStore::grad_sumsq() {
  return over_parts([](ShardedOptimizer& e) { return e.grad_sumsq(); });
}

double GroupedStore::grad_zeros() {
  return over_parts([](ShardedOptimizer& e) { return e.grad_zeros(); });
}

double GroupedStore::over_parts(const std::function<double(ShardedOptimizer&)>& f) {
  double whole = 0, split = 0;  // held alike by every rank of `across` / different there
  for (auto& p : parts_) (p.spec.group == ReduceGroup::dense ? whole : split) += f(*p.engine);
  if (parts_.size() > 1 && across_ && across_->size() > 1) across_->allreduce_sum(&split, 1);
  double total = whole + split;
  if (tp_) tp_->allreduce_sum(&total, 1);  // partitions and primary copies, each counted on one rank
  return total;
}

std::array<double, 3> GroupedStore::state_sumsq() const {
  std::array<double, 3> whole{}, split{};
  for (const auto& p : parts_) {
    const std::array<double, 3> s = p.engine->state_sumsq();
    auto& into = p.spec.group == ReduceGroup::dense ? whole : split;
    for (int i = 0; i < 3; ++i) into[i] += s[i];
  }
  if (parts_.size() > 1 && across_ && across_->size() > 1) across_->allreduce_sum(split.data(), 3);
  for (int i = 0; i < 3; ++i) whole[i] += split[i];
  if (tp_) tp_->allreduce_sum(whole.data(), 3);
  return whole;
}

void GroupedStore::adam_step(const AdamParams& a) {
  for (auto& p : parts_) {
    AdamParams pa = a;
    if (a.updated)  // the engine's blocks are the schema's, renumbered
      pa.updated = [&a, &p](int local) { a.updated(static_cast<int>(p.layout->blocks()[local].origin)); };
    p.engine->adam_step(pa);
  }
}

bool GroupedStore::step_is_local() const {
  for (const auto& p : parts_)
    if (!p.engine->step_is_local()) return false;
  return true;
}

void GroupedStore::regather(int block) {
  const Route& r = at(block);
  if (r.engine != kFrozen) parts_[r.engine].engine->regather(r.local);
}

void GroupedStore::set_before_gather(std::function<void(int)> hook) {
  for (auto& p : parts_) {
    if (!hook) {
      p.engine->set_before_gather(nullptr);
      continue;
    }
    const ParamLayout* layout = p.layout.get();  // the engine's blocks are the schema's, renumbered
    p.engine->set_before_gather([hook, layout](int local) { hook(static_cast<int>(layout->blocks()[local].origin)); });
  }
}

void GroupedStore::release_gathered() {
  for (auto& p : parts_) p.engine->release_gathered();
}

bool GroupedStore::regathers() const {
  for (const auto& p : parts_)
    if (p.engine->regathers()) return true;
  return false;
}

void GroupedStore::visit_pieces(bool load, const std::function<void(const StatePiece&)>& fn) {
  for (auto& p : parts_) {
    const auto& lb = p.layout->blocks();
    p.engine->visit_pieces(load, [&](const StatePiece& piece) {
      // A piece lies inside one block (ZeroEngine visits block slices): move it to the schema.
      auto it = std::upper_bound(lb.begin(), lb.end(), piece.begin,
                                 [](size_t v, const BlockSpec& b) { return v < b.offset; });
      const BlockSpec& b = *(it - 1);
      StatePiece q = piece;
      q.begin = schema_.blocks()[b.origin].offset + (piece.begin - b.offset);
      fn(q);
    });
  }
}

bool GroupedStore::pieces_are_live() const {
  for (const auto& p : parts_)
    if (!p.engine->pieces_are_live()) return false;
  return true;
}

void GroupedStore::after_load() {
  for (auto& p : parts_) p.engine->after_load();
}

std::vector<float> GroupedStore::gather_params() {
  std::vector<float> out(schema_.numel(), 0.0f);
  auto place = [&](Part& p, const std::vector<float>& mine) {
    for (const auto& b : p.layout->blocks())
      std::copy_n(mine.begin() + b.offset, b.numel, out.begin() + schema_.blocks()[b.origin].offset);
  };
  // Parts held differently across ranks first: zeros elsewhere, summed over `across`.
  for (auto& p : parts_)
    if (p.spec.group != ReduceGroup::dense) place(p, p.engine->gather_params());
  if (parts_.size() > 1 && across_ && across_->size() > 1) across_->allreduce_sum(out.data(), out.size());
  for (auto& p : parts_)
    if (p.spec.group == ReduceGroup::dense) place(p, p.engine->gather_params());
  if (frozen_) frozen_->copy_into(out);  // every rank holds them whole
  return out;
}

ZeroMemory GroupedStore::memory() const {
  ZeroMemory m;
  for (const auto& p : parts_) {
    ZeroMemory e = p.engine->memory();
    m.on_device = m.on_device || e.on_device;
    m.params += e.params, m.grads += e.grads, m.optimizer += e.optimizer, m.grad_shard += e.grad_shard;
    m.working_peak += e.working_peak;
    m.nvme_params += e.nvme_params, m.nvme_optimizer += e.nvme_optimizer, m.nvme_file += e.nvme_file;
  }
  m.frozen = frozen_ ? frozen_->bytes() : 0;
  return m;
}

double GroupedStore::bytes_sent() const {
  return sum_engines([](const ShardedOptimizer& e) { return e.bytes_sent(); });
}

double GroupedStore::gather_wait_seconds() const {
  return sum_engines([](const ShardedOptimizer& e) { return e.gather_wait_seconds(); });
}

double GroupedStore::reduce_wait_seconds() const {
  return sum_engines([](const ShardedOptimizer& e) { return e.reduce_wait_seconds(); });
}

SwapTraffic GroupedStore::swap_traffic() const {
  SwapTraffic t;
  for (const auto& p : parts_) {
    if (!p.engine->offloaded()) continue;
    const SwapTraffic e = p.engine->swap_traffic();
    t.bytes_read += e.bytes_read, t.bytes_written += e.bytes_written;
    t.optimizer_seconds += e.optimizer_seconds, t.optimizer_io_wait += e.optimizer_io_wait;
    t.optimizer_bytes += e.optimizer_bytes, t.param_read_seconds += e.param_read_seconds;
    t.optimizer_seconds_behind += e.optimizer_seconds_behind;
  }
  return t;
}

size_t GroupedStore::local_numel() const {
  return sum_engines([](const ShardedOptimizer& e) { return e.local_numel(); });
}

long long GroupedStore::gathers() const {
  return sum_engines([](const ShardedOptimizer& e) { return e.gathers(); });
}

}  // namespace hpct::parallel
