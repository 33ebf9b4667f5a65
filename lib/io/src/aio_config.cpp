// ds_config `aio` block <-> AioConfig, and which engines this build and kernel can run.
#include "hpct/io/aio_config.hpp"

#include <liburing.h>
#include <libaio.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "hpct/core/error.hpp"
#include "hpct/core/json_config.hpp"
#include "hpct/core/units.hpp"

namespace hpct::io {

const char* engine_name(AioEngine e) {
  switch (e) {
    case AioEngine::automatic: return "auto";
    case AioEngine::io_uring: return "io_uring";
    case AioEngine::libaio: return "libaio";
    case AioEngine::psync: return "psync";
  }
  return "?";
}

AioEngine parse_engine(const std::string& text, const std::string& key) {
  if (text == "auto") return AioEngine::automatic;
  if (text == "io_uring" || text == "uring") return AioEngine::io_uring;
  if (text == "libaio" || text == "aio") return AioEngine::libaio;
  if (text == "psync" || text == "sync" || text == "pread") return AioEngine::psync;
  throw config_error(key, "unknown IO engine '" + text + "'", "use auto, io_uring, libaio or psync");
}

bool engine_available(AioEngine e, std::string* why) {
  switch (e) {
    case AioEngine::automatic:
    case AioEngine::psync: return true;
    case AioEngine::io_uring: {
      io_uring ring;
      int rc = io_uring_queue_init(2, &ring, 0);
      if (rc < 0) {
        if (why) *why = std::string("io_uring_queue_init: ") + std::strerror(-rc) + " (kernel or seccomp refuses io_uring)";
        return false;
      }
      io_uring_queue_exit(&ring);
      return true;
    }
    case AioEngine::libaio: {
      io_context_t ctx{};
      int rc = io_setup(2, &ctx);
      if (rc < 0) {
        if (why) *why = std::string("io_setup: ") + std::strerror(-rc) + " (check /proc/sys/fs/aio-max-nr)";
        return false;
      }
      io_destroy(ctx);
      return true;
    }
  }
  return false;
}

AioEngine resolve_engine(AioEngine e, std::string* skipped) {
  if (skipped) skipped->clear();
  if (e != AioEngine::automatic) return e;
  // What the kernel allows does not change while the process runs: probe once.
  static const std::pair<AioEngine, std::string> pick = [] {
    std::string passed;
    for (AioEngine c : {AioEngine::io_uring, AioEngine::libaio}) {
      std::string why;
      if (engine_available(c, &why)) return std::make_pair(c, passed);
      passed += (passed.empty() ? "" : "; ") + std::string(engine_name(c)) + ": " + why;
    }
    return std::make_pair(AioEngine::psync, passed);
  }();
  if (skipped) *skipped = pick.second;
  return pick.first;
}

void AioConfig::validate(const std::string& prefix) const {
  auto k = [&](const char* name) { return prefix + "." + name; };
  if (block_size < 4096 || block_size % 4096 != 0)
    throw config_error(k("block_size"), "block_size " + std::to_string(block_size) + " must be a positive multiple of 4096",
                       "O_DIRECT needs requests aligned to the device's logical block size; use e.g. 1048576");
  if (block_size > (size_t{1} << 30))
    throw config_error(k("block_size"), "block_size " + format_bytes(static_cast<double>(block_size)) + " is above 1 GiB");
  if (queue_depth < 1 || queue_depth > 4096)
    throw config_error(k("queue_depth"), "queue_depth " + std::to_string(queue_depth) + " must be in 1..4096");
  if (thread_count < 1 || thread_count > 256)
    throw config_error(k("intra_op_parallelism"), "intra_op_parallelism " + std::to_string(thread_count) + " must be in 1..256");
}

AioConfig AioConfig::from_json(JsonSection& aio) {
  AioConfig c;
  if (auto v = aio.get_int("block_size")) c.block_size = static_cast<size_t>(*v < 0 ? 0 : *v);
  // In range before the narrowing to int (4294967300 would become 4 and pass).
  auto bounded = [&](const char* key, long long v, long long lo, long long hi) {
    if (v < lo || v > hi)
      throw config_error(aio.key_path(key), std::string(key) + " " + std::to_string(v) + " must be in " + std::to_string(lo) +
                                                ".." + std::to_string(hi));
    return static_cast<int>(v);
  };
  if (auto v = aio.get_int("queue_depth")) c.queue_depth = bounded("queue_depth", *v, 1, 4096);
  auto iop = aio.get_int("intra_op_parallelism");
  auto tc = aio.get_int("thread_count");
  if (iop && tc && *iop != *tc)
    throw config_error(aio.key_path("thread_count"),
                       "thread_count " + std::to_string(*tc) + " disagrees with intra_op_parallelism " + std::to_string(*iop),
                       "they are the old and new name of one knob; give one");
  if (iop) c.thread_count = bounded("intra_op_parallelism", *iop, 1, 256);
  else if (tc) c.thread_count = bounded("thread_count", *tc, 1, 256);
  if (auto v = aio.get_bool("single_submit")) c.single_submit = *v;
  if (auto v = aio.get_bool("overlap_events")) c.overlap_events = *v;
  if (auto v = aio.get_bool("use_gds"); v && *v)
    throw config_error(aio.key_path("use_gds"), "GPUDirect Storage is not supported by this build", "set use_gds false");
  // hpctrain extensions, ignored by DeepSpeed if a block travels back.
  if (auto v = aio.get_string("engine")) c.engine = parse_engine(*v, aio.key_path("engine"));
  if (auto v = aio.get_bool("direct")) c.direct = *v;
  if (auto v = aio.get_bool("pin_buffers")) c.pin_buffers = *v;
  aio.finish();
  c.validate(aio.key_path("").substr(0, aio.key_path("").size() - 1));
  return c;
}

nlohmann::json AioConfig::to_ds_json() const {
  return {{"block_size", block_size},
          {"queue_depth", queue_depth},
          {"intra_op_parallelism", thread_count},
          {"thread_count", thread_count},
          {"single_submit", single_submit},
          {"overlap_events", overlap_events},
          {"use_gds", false},
          {"engine", engine_name(engine)},
          {"direct", direct}};
}

std::string AioConfig::describe() const {
  return std::string(engine_name(engine)) + " bs=" + format_size(block_size) +
         " qd=" + std::to_string(queue_depth) + " threads=" + std::to_string(thread_count) +
         (single_submit ? " single_submit" : "") + (overlap_events ? "" : " no_overlap") + (direct ? "" : " buffered");
}

}  // namespace hpct::io
