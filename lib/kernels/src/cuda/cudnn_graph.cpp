// cuDNN's graph API, opened at run time (cudnn_graph.hpp).
#include "cudnn_graph.hpp"

#include <dlfcn.h>

#include <type_traits>

#include "hpct/core/error.hpp"

namespace hpct::kernels::cuda::cudnn {

Library::~Library() {
  if (so) dlclose(so);
}

void Library::check(cudnnStatus_t st, const std::string& what) const {
  if (st == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {0};
  if (last_error) last_error(detail, sizeof detail);
  throw Error("cuDNN: " + what + ": " + error_string(st) + (detail[0] ? std::string(": ") + detail : std::string()));
}

// libcudnn.so.9 and its graph API's functions; nullptr with the reason where it cannot be had.
std::unique_ptr<Library> load(std::string* why) {
  auto lib = std::make_unique<Library>();
  lib->so = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  if (!lib->so) {
    if (why) *why = std::string("libcudnn.so.9 not found (") + dlerror() + ")";
    return nullptr;
  }
  bool ok = true;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib->so, name));
    if (!fn) ok = false;
  };
  sym(lib->get_version, "cudnnGetVersion");
  sym(lib->error_string, "cudnnGetErrorString");
  sym(lib->create, "cudnnCreate");
  sym(lib->destroy, "cudnnDestroy");
  sym(lib->set_stream, "cudnnSetStream");
  sym(lib->create_desc, "cudnnBackendCreateDescriptor");
  sym(lib->destroy_desc, "cudnnBackendDestroyDescriptor");
  sym(lib->set_attr, "cudnnBackendSetAttribute");
  sym(lib->get_attr, "cudnnBackendGetAttribute");
  sym(lib->finalize, "cudnnBackendFinalize");
  sym(lib->execute, "cudnnBackendExecute");
  if (!ok) {
    if (why) *why = "libcudnn.so.9 lacks the graph API's functions";
    return nullptr;
  }
  lib->last_error = reinterpret_cast<decltype(lib->last_error)>(dlsym(lib->so, "cudnnGetLastErrorString"));
  return lib;
}


// The operation graph and the first engine configuration of cuDNN's heuristics (mode A) that
// finalizes into an execution plan: for the handle's GPU, or without one (h null) for the device
// `device` describes (a DEVICEPROP descriptor: cuDNN compiles for it ahead of time).
void build(const Library& L, cudnnHandle_t h, cudnnBackendDescriptor_t device, Graph& g,
           Plan& out, const char* which) {
  out.graph = std::make_unique<Desc>(L, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "the operation graph");
  if (h) out.graph->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  out.graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)g.ops().size(), g.ops().data())
      .finalize();
  out.heuristics = std::make_unique<Desc>(L, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "the heuristics");
  Desc& heur = *out.heuristics;
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, out.graph->get()).set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (!h) heur.set(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, device);
  heur.finalize();
  int64_t count = 0;
  L.check(L.get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
          std::string("counting the heuristics' engines for the ") + which);
  if (count <= 0) throw Error(std::string("cuDNN: no engine for the ") + which + " graph on this device");
  std::vector<Desc> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    cfgs.emplace_back(L, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "an engine configuration");
    raw.push_back(cfgs.back().get());
  }
  int64_t got = 0;
  L.check(L.get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()),
          std::string("reading the heuristics' engines for the ") + which);
  if (got <= 0) throw Error(std::string("cuDNN: no engine for the ") + which + " graph on this device");
  std::string last;
  for (int64_t i = 0; i < got; ++i) {
    auto plan = std::make_unique<Desc>(L, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "an execution plan");
    if (h) plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    else plan->set(CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, device);
    plan->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[i]);
    const cudnnStatus_t st = L.finalize(plan->get());
    if (st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER && !h) {
      // Ahead of time without a GPU: the engine passed its support checks and cuDNN generated and
      // compiled its kernel (NVRTC); only loading it needs a GPU's driver (there is a stub).
      out.linked = false;
      out.graph_parts = g.release();
      return;
    }
    if (st != CUDNN_STATUS_SUCCESS) {
      try {
        L.check(st, std::string("finalizing the ") + which + " execution plan");
      } catch (const Error& e) {
        last = e.what();
      }
      continue;
    }
    int64_t n = 0;
    L.check(L.get_attr(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &out.workspace),
            "reading a plan's workspace size");
    out.plan = std::move(plan);
    out.config = std::make_unique<Desc>(std::move(cfgs[static_cast<size_t>(i)]));
    out.graph_parts = g.release();
    return;
  }
  throw Error(std::string("cuDNN: none of the ") + std::to_string(got) + " engines for the " + which +
              " graph builds a plan" + (last.empty() ? "" : " (" + last + ")"));
}

void execute(const Library& L, cudnnHandle_t h, const Plan& p,
             const std::vector<int64_t>& uids, const std::vector<void*>& ptrs, void* workspace, const char* which) {
  Desc pack(L, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "a variant pack");
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)ptrs.size(), ptrs.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace)
      .finalize();
  L.check(L.execute(h, p.plan->get(), pack.get()), std::string("running the fused attention ") + which);
}

}  // namespace hpct::kernels::cuda::cudnn
