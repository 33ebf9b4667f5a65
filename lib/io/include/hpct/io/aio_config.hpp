// hpct/io/aio_config.hpp — the knobs of the async IO engine, named as DeepSpeed's ds_config `aio`
// block names them, so a block written by `nvme_bench --tune` (or taken from a DeepSpeed recipe)
// is read unchanged by the offload and checkpoint code.
//
// Not here: the engine itself (async_io.hpp). Defaults are the ds_config defaults (block 1 MiB,
// queue depth 8, one thread, batched submit, overlapped events), not those of DeepSpeed's
// aio_handle() constructor (queue depth 128, overlap off); see docs/nvme_bench.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace hpct {
class JsonSection;
}

namespace hpct::io {

/// `automatic` ("auto", the default) is the first of io_uring, libaio, psync that this kernel runs:
/// io_uring is refused by some kernels (the kernel.io_uring_disabled sysctl) and container seccomp
/// policies (Docker's default since 2023), libaio by an exhausted fs.aio-max-nr. A named engine is
/// used as named or refused with the reason.
enum class AioEngine { automatic, io_uring, libaio, psync };

const char* engine_name(AioEngine e);
/// "auto" | "io_uring" | "libaio" | "psync"; throws config_error(key, ...) otherwise.
AioEngine parse_engine(const std::string& text, const std::string& key);
/// Whether this build and this kernel can run the engine (io_uring can be compiled in and still be
/// refused by the kernel or a seccomp policy). Sets *why when not. `automatic` is always available.
bool engine_available(AioEngine e, std::string* why = nullptr);
/// The engine `e` stands for: itself, or for `automatic` the first available in preference order
/// (probed once per process with a small queue). When `automatic` had to pass over io_uring,
/// *skipped says why (e.g. "io_uring: io_uring_queue_init: Operation not permitted (...)"); else it
/// is cleared. AsyncIo goes on to the next engine if the probed one then refuses the real queue.
AioEngine resolve_engine(AioEngine e, std::string* skipped = nullptr);

struct AioConfig {
  size_t block_size = 1 << 20;  // bytes per IO request the engine sends to the kernel
  int queue_depth = 8;          // requests in flight per thread
  int thread_count = 1;         // ds: intra_op_parallelism (formerly thread_count): threads that split one request
  bool single_submit = false;   // submit requests one at a time instead of as a batch
  bool overlap_events = true;   // submit new requests as earlier ones complete (else: batch, drain, repeat)
  AioEngine engine = AioEngine::automatic;  // not a DeepSpeed key: DeepSpeed only has libaio
  bool direct = true;           // O_DIRECT; false = buffered (page cache), only when asked
  bool pin_buffers = false;     // mlock() the pool's buffers (DeepSpeed's "locked tensors")

  /// Throws config_error naming `prefix.key` for a value out of range.
  void validate(const std::string& prefix = "aio") const;
  /// Reads a ds_config `aio` object. Accepts `intra_op_parallelism` and the older `thread_count`
  /// (both together only if equal); `use_gds` true is rejected (no GPUDirect Storage in this build).
  static AioConfig from_json(JsonSection& aio);
  /// The `aio` object as DeepSpeed writes it (both thread key names, for old and new DeepSpeed).
  nlohmann::json to_ds_json() const;
  std::string describe() const;
};

}  // namespace hpct::io
