// The node's GPUs (CUDA runtime) and NCCL on device buffers, deadline-bounded (see gpu.hpp).
#include "hpct/comm/gpu.hpp"

#include "hpct/comm/deadline.hpp"

#include <algorithm>

#ifdef HPCT_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>

#include <deque>
#endif

namespace hpct::comm {

#ifndef HPCT_HAVE_NCCL

namespace {
const char* kNotBuilt = "built without CUDA + NCCL (configure with -DHPCT_ENABLE_CUDA=ON where nvcc and NCCL are installed)";
bool not_built(std::string* why) {
  if (why) *why = kNotBuilt;
  return false;
}
}  // namespace

struct NcclComm::Impl {};
bool gpu_support_built() { return false; }
int gpu_count(std::string* why) {
  not_built(why);
  return 0;
}
std::vector<GpuInfo> list_gpus(std::string* why) {
  not_built(why);
  return {};
}
std::unique_ptr<NcclComm> NcclComm::create(MPI_Comm, int, double, PollPolicy, std::string* why) {
  not_built(why);
  return nullptr;
}
NcclComm::~NcclComm() = default;
bool NcclComm::resize(size_t, std::string* why) { return not_built(why); }
bool NcclComm::upload(const float*, size_t, std::string* why) { return not_built(why); }
bool NcclComm::download(float*, size_t, std::string* why) { return not_built(why); }
bool NcclComm::start_allreduce(size_t, std::string* why) { return not_built(why); }
bool NcclComm::start_alltoall(size_t, std::string* why) { return not_built(why); }
bool NcclComm::wait(double, std::string* why) { return not_built(why); }
bool NcclComm::allreduce(void*, size_t, Elem, bool, double, std::string* why) { return not_built(why); }
bool NcclComm::allgather_blocks(void*, size_t, Elem, double, std::string* why) { return not_built(why); }
bool NcclComm::reduce_scatter_blocks(const void*, void*, size_t, Elem, double, std::string* why) { return not_built(why); }
bool NcclComm::start_reduce_scatter_blocks(const void*, void*, size_t, Elem, void*, double, Ticket*, std::string* why) {
  return not_built(why);
}
bool NcclComm::start_allreduce(void*, size_t, Elem, void*, double, Ticket*, std::string* why) { return not_built(why); }
bool NcclComm::start_allgather_blocks(void*, size_t, Elem, void*, double, Ticket*, std::string* why) {
  return not_built(why);
}
void NcclComm::join(Ticket, void*) {}
bool NcclComm::finish(double, std::string* why) { return not_built(why); }

#else

namespace {
bool cuda_ok(cudaError_t e, const char* what, std::string* why) {
  if (e == cudaSuccess) return true;
  if (why) *why = std::string(what) + ": " + cudaGetErrorString(e);
  return false;
}
}  // namespace

// What the MPI handshake of create() hands to MPI. On a timeout its requests stay pending inside
// MPI, which may still write here: such handshakes are kept until the process ends.
struct Handshake {
  int ok = 0, all_ok = 0;
  struct {
    ncclUniqueId id;
    ncclResult_t made;
  } root{};
  MPI_Request req = MPI_REQUEST_NULL;
};
std::deque<std::unique_ptr<Handshake>>& abandoned_handshakes() {
  static std::deque<std::unique_ptr<Handshake>> g;
  return g;
}

struct NcclComm::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* in = nullptr;
  float* out = nullptr;
  size_t capacity = 0;  // floats in each buffer
  int rank = 0, size = 1, device = 0;
  bool aborted = false;
  double timeout_s = 30;  // for the teardown: the window create() was given
  PollPolicy poll;
  // Started collectives (start_*): the event after each, by ticket, until finish(); events reused.
  cudaEvent_t behind = nullptr;  // recorded on the caller's queue, waited for by this stream
  std::deque<std::pair<DeviceCollectives::Ticket, cudaEvent_t>> started;
  std::vector<cudaEvent_t> spare;
  DeviceCollectives::Ticket next_ticket = 1;
  std::string join_error;  // a failed join, reported by finish()

  void yield() const {
    if (poll.yield) sched_yield();  // more ranks than cores: leave room for NCCL's own threads
  }

  bool fail(const std::string& what, std::string* why) {
    if (why) *why = what;
    if (comm && !aborted) ncclCommAbort(comm);  // never blocks on the peers
    aborted = true;
    return false;
  }
  // False (why set) once an earlier failure aborted the communicator: every later call fails.
  bool usable(std::string* why) {
    return !aborted || fail("the NCCL communicator was aborted after an earlier failure", why);
  }
  bool enqueued(ncclResult_t r, const char* what, std::string* why) {
    if (r == ncclSuccess || r == ncclInProgress) return true;  // nonblocking: progress is polled in wait()
    return fail(std::string(what) + ": " + ncclGetErrorString(r), why);
  }
  // A nonblocking communicator's call may return before its kernel is on the stream (ncclInProgress):
  // NCCL puts it there once the asynchronous state is ncclSuccess, so an event recorded after it
  // waits for this. Polls until then, or `deadline`.
  bool settled(double deadline, std::string* why) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return fail("ncclCommGetAsyncError failed", why);
      if (state == ncclSuccess) return true;
      if (state != ncclInProgress) return fail(std::string("NCCL: ") + ncclGetErrorString(state), why);
      if (steady_seconds() > deadline) return fail("timeout: NCCL did not queue the operation before the deadline", why);
      yield();
    }
  }
  // This stream waits for what `queue` holds now (the caller's writes to the collective's input).
  bool after(void* queue, std::string* why) {
    if (!queue) return true;
    if (!behind && !cuda_ok(cudaEventCreateWithFlags(&behind, cudaEventDisableTiming), "cudaEventCreateWithFlags", why))
      return fail(*why, why);
    if (!cuda_ok(cudaEventRecord(behind, static_cast<cudaStream_t>(queue)), "cudaEventRecord (the caller's queue)", why) ||
        !cuda_ok(cudaStreamWaitEvent(stream, behind, 0), "cudaStreamWaitEvent (NCCL's stream)", why))
      return fail(*why, why);
    return true;
  }
  // The event after a started collective, its ticket in *t.
  bool mark_started(DeviceCollectives::Ticket* t, std::string* why) {
    cudaEvent_t ev = nullptr;
    if (!spare.empty()) {
      ev = spare.back();
      spare.pop_back();
    } else if (!cuda_ok(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags", why)) {
      return fail(*why, why);
    }
    if (!cuda_ok(cudaEventRecord(ev, stream), "cudaEventRecord (NCCL's stream)", why)) {
      spare.push_back(ev);
      return fail(*why, why);
    }
    *t = next_ticket++;
    started.emplace_back(*t, ev);
    return true;
  }
};

bool gpu_support_built() { return true; }

int gpu_count(std::string* why) {
  int n = 0;
  if (!cuda_ok(cudaGetDeviceCount(&n), "cudaGetDeviceCount", why)) return 0;
  if (n == 0 && why) *why = "the CUDA runtime sees no GPU";
  return n;
}

std::vector<GpuInfo> list_gpus(std::string* why) {
  int n = 0;
  if (!cuda_ok(cudaGetDeviceCount(&n), "cudaGetDeviceCount", why)) return {};
  if (n == 0) {
    if (why) *why = "the CUDA runtime sees no GPU";
    return {};
  }
  // cudaSetDevice creates each GPU's primary context (needed for cudaMemGetInfo); the current
  // device is put back afterwards.
  int current = 0;
  const bool restore = cudaGetDevice(&current) == cudaSuccess;
  std::vector<GpuInfo> out;
  for (int i = 0; i < n; ++i) {
    GpuInfo g;
    g.index = i;
    cudaDeviceProp prop{};
    if (!cuda_ok(cudaGetDeviceProperties(&prop, i), "cudaGetDeviceProperties", why)) return {};
    g.name = prop.name;
    g.total_bytes = prop.totalGlobalMem;
    char bus[32] = {0};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, i) == cudaSuccess) g.pci_bus_id = bus;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) g.free_bytes = free_b;
    out.push_back(std::move(g));
  }
  if (restore) cudaSetDevice(current);
  return out;
}

std::unique_ptr<NcclComm> NcclComm::create(MPI_Comm comm, int local_rank, double deadline, PollPolicy poll,
                                           std::string* why) {
  std::unique_ptr<NcclComm> c(new NcclComm());
  c->impl_ = std::make_unique<Impl>();
  Impl& m = *c->impl_;
  m.poll = poll;
  m.timeout_s = std::max(1.0, deadline - steady_seconds());
  MPI_Comm_rank(comm, &m.rank);
  MPI_Comm_size(comm, &m.size);
  c->rank_ = m.rank, c->size_ = m.size;
  auto hs = std::make_unique<Handshake>();
  auto wait = [&](const char* what) {
    if (wait_all_until(&hs->req, 1, deadline, poll)) return true;
    if (why) *why = what;
    abandoned_handshakes().push_back(std::move(hs));  // MPI may still write into it
    return false;
  };
  // Every rank must have a GPU before anyone enters NCCL's initialisation (which would wait for
  // the missing ones): agree first, over MPI, with a deadline.
  std::string local_why;
  int ngpu = 0;
  hs->ok = cuda_ok(cudaGetDeviceCount(&ngpu), "cudaGetDeviceCount", &local_why) ? 1 : 0;
  if (hs->ok && ngpu == 0) {
    hs->ok = 0;
    local_why = "the CUDA runtime sees no GPU";
  }
  if (hs->ok) {
    c->device_ = m.device = local_rank % ngpu;
    hs->ok = cuda_ok(cudaSetDevice(c->device_), "cudaSetDevice", &local_why) ? 1 : 0;
  }
  MPI_Iallreduce(&hs->ok, &hs->all_ok, 1, MPI_INT, MPI_MIN, comm, &hs->req);
  if (!wait("ranks did not agree on their GPUs before the deadline")) return nullptr;
  if (!hs->all_ok) {
    if (why) *why = hs->ok ? "another rank has no usable GPU" : local_why;
    return nullptr;
  }
  if (m.rank == 0) hs->root.made = ncclGetUniqueId(&hs->root.id);
  MPI_Ibcast(&hs->root, static_cast<int>(sizeof hs->root), MPI_BYTE, 0, comm, &hs->req);
  if (!wait("NCCL's unique id did not arrive from rank 0 before the deadline")) return nullptr;
  if (hs->root.made != ncclSuccess) {
    if (why) *why = std::string("ncclGetUniqueId on rank 0: ") + ncclGetErrorString(hs->root.made);
    return nullptr;
  }
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;  // initialisation returns at once; its progress is polled below
  ncclResult_t r = ncclCommInitRankConfig(&m.comm, m.size, hs->root.id, m.rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    m.fail(std::string("ncclCommInitRankConfig: ") + ncclGetErrorString(r), why);  // frees a half-made one
    return nullptr;
  }
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    if (ncclCommGetAsyncError(m.comm, &state) != ncclSuccess) break;
    if (state == ncclInProgress && steady_seconds() > deadline) {
      m.fail("NCCL initialisation did not complete before the deadline", why);
      return nullptr;
    }
    m.yield();
  }
  if (state != ncclSuccess) {
    m.fail(std::string("NCCL initialisation: ") + ncclGetErrorString(state), why);
    return nullptr;
  }
  std::string stream_why;
  if (!cuda_ok(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", &stream_why)) {
    m.fail(stream_why, why);
    return nullptr;
  }
  return c;
}

NcclComm::~NcclComm() {
  if (!impl_) return;
  Impl& m = *impl_;
  // After a failure the device may hold a kernel that never ends: cudaFree or cudaStreamDestroy
  // could wait for it. Leave the memory to the process's end (the job is being ended anyway).
  if (m.aborted) return;
  if (m.comm) {
    // A healthy communicator is finalized (its last sends to the peers are flushed) before it is
    // destroyed; aborting it could cut off a slower peer's last operation. Bounded by the window
    // create() was given; past it, abort.
    const double deadline = steady_seconds() + m.timeout_s;
    ncclResult_t state = ncclCommFinalize(m.comm);
    if (state == ncclSuccess || state == ncclInProgress) {
      do {
        if (ncclCommGetAsyncError(m.comm, &state) != ncclSuccess) state = ncclInternalError;
        if (state == ncclInProgress) m.yield();
      } while (state == ncclInProgress && steady_seconds() < deadline);
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(m.comm);
    } else {
      ncclCommAbort(m.comm);
      return;
    }
  }
  cudaSetDevice(m.device);
  for (auto& [t, ev] : m.started) cudaEventDestroy(ev);
  for (cudaEvent_t ev : m.spare) cudaEventDestroy(ev);
  if (m.behind) cudaEventDestroy(m.behind);
  if (m.in) cudaFree(m.in);
  if (m.out) cudaFree(m.out);
  if (m.stream) cudaStreamDestroy(m.stream);
}

bool NcclComm::resize(size_t count, std::string* why) {
  Impl& m = *impl_;
  if (!m.usable(why)) return false;
  if (count <= m.capacity) return true;
  if (!cuda_ok(cudaSetDevice(m.device), "cudaSetDevice", why)) return false;
  if (m.in) cudaFree(m.in);
  if (m.out) cudaFree(m.out);
  m.in = m.out = nullptr;
  m.capacity = 0;
  if (!cuda_ok(cudaMalloc(reinterpret_cast<void**>(&m.in), count * sizeof(float)), "cudaMalloc", why) ||
      !cuda_ok(cudaMalloc(reinterpret_cast<void**>(&m.out), count * sizeof(float)), "cudaMalloc", why))
    return false;
  m.capacity = count;
  return true;
}

bool NcclComm::upload(const float* host, size_t count, std::string* why) {
  Impl& m = *impl_;
  if (count > m.capacity) return m.fail("upload of more floats than resize() allocated (a caller bug)", why);
  return cuda_ok(cudaSetDevice(m.device), "cudaSetDevice", why) &&
         cuda_ok(cudaMemcpy(m.in, host, count * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy", why);
}

bool NcclComm::download(float* host, size_t count, std::string* why) {
  Impl& m = *impl_;
  if (count > m.capacity) return m.fail("download of more floats than resize() allocated (a caller bug)", why);
  return cuda_ok(cudaSetDevice(m.device), "cudaSetDevice", why) &&
         cuda_ok(cudaMemcpy(host, m.out, count * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy", why);
}

bool NcclComm::start_allreduce(size_t count, std::string* why) {
  Impl& m = *impl_;
  if (!m.usable(why)) return false;
  return m.enqueued(ncclAllReduce(m.in, m.out, count, ncclFloat, ncclSum, m.comm, m.stream), "ncclAllReduce", why);
}

bool NcclComm::start_alltoall(size_t count, std::string* why) {
  Impl& m = *impl_;
  if (!m.usable(why)) return false;
  const size_t per = count / static_cast<size_t>(m.size);
  if (!m.enqueued(ncclGroupStart(), "ncclGroupStart", why)) return false;
  ncclResult_t bad = ncclSuccess;
  const char* what = "";
  for (int p = 0; p < m.size && bad == ncclSuccess; ++p) {
    ncclResult_t r = ncclSend(m.in + p * per, per, ncclFloat, p, m.comm, m.stream);
    if (r != ncclSuccess && r != ncclInProgress) bad = r, what = "ncclSend";
    else if ((r = ncclRecv(m.out + p * per, per, ncclFloat, p, m.comm, m.stream)) != ncclSuccess && r != ncclInProgress)
      bad = r, what = "ncclRecv";
  }
  // The group is always closed, even after a failed call: a thread left inside a group would
  // queue every later NCCL call behind a group end that never comes.
  ncclResult_t end = ncclGroupEnd();
  if (bad != ncclSuccess) return m.enqueued(bad, what, why);
  return m.enqueued(end, "ncclGroupEnd", why);
}

bool NcclComm::wait(double deadline, std::string* why) {
  Impl& m = *impl_;
  if (!m.usable(why)) return false;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(m.comm, &state);
    if (r != ncclSuccess) return m.fail(std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(r), why);
    if (state != ncclSuccess && state != ncclInProgress)
      return m.fail(std::string("NCCL: ") + ncclGetErrorString(state), why);
    if (state == ncclSuccess) {
      cudaError_t q = cudaStreamQuery(m.stream);
      if (q == cudaSuccess) return true;
      if (q != cudaErrorNotReady) return m.fail(std::string("cudaStreamQuery: ") + cudaGetErrorString(q), why);
    }
    if (steady_seconds() > deadline) return m.fail("timeout: the NCCL operation did not complete before the deadline", why);
    m.yield();
  }
}

namespace {
ncclDataType_t nccl_type(DeviceCollectives::Elem e) {
  switch (e) {
    case DeviceCollectives::Elem::f64: return ncclDouble;
    case DeviceCollectives::Elem::bf16: return ncclBfloat16;
    case DeviceCollectives::Elem::f16: return ncclFloat16;
    default: return ncclFloat;
  }
}
}  // namespace

bool NcclComm::allreduce(void* buf, size_t count, Elem e, bool max, double deadline, std::string* why) {
  Impl& m = *impl_;
  if (!m.usable(why)) return false;
  return m.enqueued(ncclAllReduce(buf, buf, count, nccl_type(e), max ? ncclMax : ncclSum, m.comm, m.stream),
                    "ncclAllReduce", why) &&
         wait(deadline, why);
}

bool NcclComm::allgather_blocks(void* buf, size_t block, Elem e, double deadline, std::string* why) {
  Impl& m = *impl_;
  if (!m.usable(why)) return false;
  // In place: this rank's block is already where the gathered buffer wants it.
  const void* mine = static_cast<const char*>(buf) + m.rank * block * bytes(e);
  return m.enqueued(ncclAllGather(mine, buf, block, nccl_type(e), m.comm, m.stream), "ncclAllGather", why) &&
         wait(deadline, why);
}

bool NcclComm::reduce_scatter_blocks(const void* full, void* slice, size_t block, Elem e, double deadline,
                                     std::string* why) {
  Impl& m = *impl_;
  if (!m.usable(why)) return false;
  return m.enqueued(ncclReduceScatter(full, slice, block, nccl_type(e), ncclSum, m.comm, m.stream),
                    "ncclReduceScatter", why) &&
         wait(deadline, why);
}

bool NcclComm::start_reduce_scatter_blocks(const void* full, void* slice, size_t block, Elem e, void* queue,
                                           double deadline, Ticket* t, std::string* why) {
  Impl& m = *impl_;
  if (!m.usable(why)) return false;
  return m.after(queue, why) &&
         m.enqueued(ncclReduceScatter(full, slice, block, nccl_type(e), ncclSum, m.comm, m.stream), "ncclReduceScatter",
                    why) &&
         m.settled(deadline, why) && m.mark_started(t, why);
}

bool NcclComm::start_allreduce(void* buf, size_t count, Elem e, void* queue, double deadline, Ticket* t,
                               std::string* why) {
  Impl& m = *impl_;
  if (!m.usable(why)) return false;
  return m.after(queue, why) &&
         m.enqueued(ncclAllReduce(buf, buf, count, nccl_type(e), ncclSum, m.comm, m.stream), "ncclAllReduce", why) &&
         m.settled(deadline, why) && m.mark_started(t, why);
}

bool NcclComm::start_allgather_blocks(void* buf, size_t block, Elem e, void* queue, double deadline, Ticket* t,
                                      std::string* why) {
  Impl& m = *impl_;
  if (!m.usable(why)) return false;
  const void* mine = static_cast<const char*>(buf) + m.rank * block * bytes(e);  // in place, as allgather_blocks
  return m.after(queue, why) &&
         m.enqueued(ncclAllGather(mine, buf, block, nccl_type(e), m.comm, m.stream), "ncclAllGather", why) &&
         m.settled(deadline, why) && m.mark_started(t, why);
}

void NcclComm::join(Ticket t, void* queue) {
  Impl& m = *impl_;
  if (!queue || m.aborted) return;
  for (const auto& [k, ev] : m.started) {
    if (k != t) continue;
    const cudaError_t r = cudaStreamWaitEvent(static_cast<cudaStream_t>(queue), ev, 0);
    if (r != cudaSuccess && m.join_error.empty()) m.join_error = std::string("cudaStreamWaitEvent: ") + cudaGetErrorString(r);
    return;
  }
  if (m.join_error.empty()) m.join_error = "join of a collective that was never started (ticket " + std::to_string(t) + ")";
}

bool NcclComm::finish(double deadline, std::string* why) {
  Impl& m = *impl_;
  if (!m.usable(why)) return false;
  if (!m.join_error.empty()) return m.fail(m.join_error, why);
  if (m.started.empty()) return true;
  if (!wait(deadline, why)) return false;
  for (auto& [t, ev] : m.started) m.spare.push_back(ev);  // done: reused by later starts
  m.started.clear();
  return true;
}

#endif

}  // namespace hpct::comm
