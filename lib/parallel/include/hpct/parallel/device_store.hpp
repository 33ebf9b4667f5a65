// hpct/parallel/device_store.hpp — ZeRO-Offload: the model computes on a device, the ZeRO engine's
// states (and its optimizer step) stay in host memory.
//
// What it is: a ParamStore for a model on a device backend (kernels::cuda_ops()) that stands in
// front of a host ParamStore (the ZeroEngine). params(b) takes the host block (gathered first at
// stage 3, widened from 16 bits in bf16/fp16 runs) and copies it to the device; grads(b) hands the
// model a device buffer, zeroed for the micro-step; grads_ready(b) copies that gradient back, adds it
// into the engine's gradient for the block, and tells the engine, which reduces and, after the step,
// runs AdamW on the host (CPU, or swapped through NVMe with offload_optimizer.device nvme: ZeRO-
// Infinity). This is DeepSpeed's ZeRO-Offload data flow: gradients device -> host, update on the
// host, parameters host -> device.
// With cache_params (stages 0-2, where a rank holds every parameter and they change only in the
// optimizer step or a checkpoint load) the device holds fp32 parameters and gradients of the whole
// model (8 bytes per parameter); a block is copied once and kept until invalidate(), which the
// trainer calls after each step and load. Without it (stage 3) a block lives on the device only
// while the model uses it, as ZeRO-3 means: its parameters from params(b) to release(b), its
// gradient from grads(b) to grads_ready(b); every params(b) copies what the engine gathered.
// What it is not (yet): 16-bit parameters on the device, a device-side pool (each stage-3 block is
// a fresh allocation), and overlap: the copies are synchronous. Status: compiled in CUDA builds, never run on a GPU here;
// on the CPU backend it is exercised by tests/parallel (its copies are then memcpys).
#pragma once
#include <cstddef>
#include <vector>

#include "hpct/core/param_layout.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "hpct/model/gpt.hpp"

namespace hpct::parallel {

class DeviceStore final : public model::ParamStore {
 public:
  /// host: the engine (must outlive this); be: the model's backend. With cache_params allocates
  /// 2 x 4 x numel bytes on the device at once.
  DeviceStore(model::ParamStore& host, const ParamLayout& layout, kernels::OpsBackend& be, bool cache_params);
  /// The host parameters changed (an optimizer step, a checkpoint load): copy every block again.
  void invalidate();

  const float* params(int block) override;
  float* grads(int block) override;
  void release(int block) override;
  void grads_ready(int block) override;

  /// Bytes of parameters and gradients (fp32) in the backend's memory: the whole model's with
  /// cache_params, else the high-water mark of the blocks live at once.
  size_t device_bytes() const { return peak_; }
  /// Bytes copied host -> device (parameters) and device -> host (gradients) since construction.
  double bytes_to_device() const { return to_device_; }
  double bytes_to_host() const { return to_host_; }

 private:
  model::ParamStore& host_;
  const ParamLayout& layout_;
  kernels::OpsBackend& be_;
  float* param_slot(int b);
  float* grad_slot(int b);
  float* take(std::vector<kernels::BackendBuffer>& blocks, int b);  // allocate block b's buffer if absent
  void give_back(std::vector<kernels::BackendBuffer>& blocks, int b);

  kernels::BackendBuffer dparams_, dgrads_;             // cache_params: the whole model
  std::vector<kernels::BackendBuffer> pblock_, gblock_;  // stage 3: per block, while in use
  size_t live_ = 0, peak_ = 0;
  std::vector<float> staging_;  // one block's gradient on its way to the engine
  std::vector<char> active_;    // per block: its device gradient holds this micro-step's sum
  bool cache_;
  std::vector<char> fresh_;     // per block: the device copy equals the host's (cache_ only)
  std::vector<char> held_;      // per block: host_.params(b) was taken and not yet released
  double to_device_ = 0, to_host_ = 0;
};

}  // namespace hpct::parallel
