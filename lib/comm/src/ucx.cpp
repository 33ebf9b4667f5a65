// UCP wrapper: context, worker, endpoints, tagged send/recv with deadline waits; UCT resource list.
// Requests are created without callbacks and polled with ucp_request_check_status, the simplest
// correct pattern for a single-threaded prober.
#include "hpct/comm/ucx.hpp"

#include "hpct/comm/deadline.hpp"
#include "hpct/core/error.hpp"

#ifdef HPCT_HAVE_UCX
#include <sched.h>
#include <ucp/api/ucp.h>
#include <uct/api/uct.h>
#endif

namespace hpct::comm {

#ifdef HPCT_HAVE_UCX

namespace {
[[noreturn]] void throw_ucs(const char* call, ucs_status_t st) {
  throw Error(std::string("UCX error: ") + ucs_status_string(st) + " [" + call + "]");
}
#define HPCT_CHECK_UCS(call)                       \
  do {                                             \
    ucs_status_t hpct_ucs_st_ = (call);            \
    if (hpct_ucs_st_ != UCS_OK) throw_ucs(#call, hpct_ucs_st_); \
  } while (0)

const char* device_type_name(uct_device_type_t t) {
  switch (t) {
    case UCT_DEVICE_TYPE_NET: return "net";
    case UCT_DEVICE_TYPE_SHM: return "shm";
    case UCT_DEVICE_TYPE_ACC: return "acc";
    case UCT_DEVICE_TYPE_SELF: return "self";
    default: return "other";
  }
}
}  // namespace

bool ucx_available() { return true; }

std::string ucx_version() {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

std::vector<UcxDevice> ucx_devices() {
  std::vector<UcxDevice> out;
  uct_component_h* comps = nullptr;
  unsigned ncomps = 0;
  HPCT_CHECK_UCS(uct_query_components(&comps, &ncomps));
  for (unsigned c = 0; c < ncomps; ++c) {
    uct_component_attr_t cattr{};
    cattr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(comps[c], &cattr) != UCS_OK) continue;
    std::vector<uct_md_resource_desc_t> mds(cattr.md_resource_count);
    cattr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    cattr.md_resources = mds.data();
    if (!mds.empty() && uct_component_query(comps[c], &cattr) != UCS_OK) continue;
    for (const auto& mdr : mds) {
      uct_md_config_t* mdc = nullptr;
      if (uct_md_config_read(comps[c], nullptr, nullptr, &mdc) != UCS_OK) continue;
      uct_md_h md = nullptr;
      ucs_status_t st = uct_md_open(comps[c], mdr.md_name, mdc, &md);
      uct_config_release(mdc);
      if (st != UCS_OK) continue;
      uct_tl_resource_desc_t* tls = nullptr;
      unsigned ntl = 0;
      if (uct_md_query_tl_resources(md, &tls, &ntl) == UCS_OK) {
        for (unsigned t = 0; t < ntl; ++t)
          out.push_back({cattr.name, mdr.md_name, tls[t].tl_name, tls[t].dev_name, device_type_name(tls[t].dev_type)});
        uct_release_tl_resource_list(tls);
      }
      uct_md_close(md);
    }
  }
  uct_release_component_list(comps);
  return out;
}

struct UcxWorker::Impl {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<ucp_ep_h> eps;
  std::vector<void*> pending;  // UCS_PTR requests in flight
  bool abandoned = false;      // a close timed out: leave the worker to the process exit
};

UcxWorker::UcxWorker() : impl_(std::make_unique<Impl>()) {
  ucp_config_t* config = nullptr;
  HPCT_CHECK_UCS(ucp_config_read(nullptr, nullptr, &config));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  ucs_status_t st = ucp_init(&params, config, &impl_->context);
  ucp_config_release(config);
  if (st != UCS_OK) throw_ucs("ucp_init", st);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(impl_->context, &wp, &impl_->worker);
  if (st != UCS_OK) {
    ucp_cleanup(impl_->context);
    throw_ucs("ucp_worker_create", st);
  }
}

UcxWorker::~UcxWorker() {
  // After a timeout requests may still be pending on a hung peer: leave them (and the worker) to
  // the process exit rather than block here.
  if (!impl_ || impl_->abandoned || !impl_->pending.empty() || !impl_->eps.empty()) return;
  ucp_worker_destroy(impl_->worker);
  ucp_cleanup(impl_->context);
}

std::vector<char> UcxWorker::address() const {
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  HPCT_CHECK_UCS(ucp_worker_get_address(impl_->worker, &addr, &len));
  std::vector<char> out(reinterpret_cast<char*>(addr), reinterpret_cast<char*>(addr) + len);
  ucp_worker_release_address(impl_->worker, addr);
  return out;
}

int UcxWorker::connect(const std::vector<char>& peer_address) {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
  ucp_ep_h h = nullptr;
  HPCT_CHECK_UCS(ucp_ep_create(impl_->worker, &ep, &h));
  impl_->eps.push_back(h);
  return static_cast<int>(impl_->eps.size()) - 1;
}

void UcxWorker::post_send(int ep, const void* buf, size_t n, uint64_t tag) {
  ucp_request_param_t p{};
  ucs_status_ptr_t r = ucp_tag_send_nbx(impl_->eps.at(static_cast<size_t>(ep)), buf, n, tag, &p);
  if (UCS_PTR_IS_ERR(r)) throw_ucs("ucp_tag_send_nbx", UCS_PTR_STATUS(r));
  if (r != nullptr) impl_->pending.push_back(r);
}

void UcxWorker::post_recv(void* buf, size_t n, uint64_t tag) {
  ucp_request_param_t p{};
  ucs_status_ptr_t r = ucp_tag_recv_nbx(impl_->worker, buf, n, tag, ~ucp_tag_t(0), &p);
  if (UCS_PTR_IS_ERR(r)) throw_ucs("ucp_tag_recv_nbx", UCS_PTR_STATUS(r));
  if (r != nullptr) impl_->pending.push_back(r);
}

bool UcxWorker::wait_all_until(double deadline, bool yield) {
  auto& pend = impl_->pending;
  auto sweep = [&pend]() {  // frees completed requests; true when none is left
    for (size_t i = 0; i < pend.size();) {
      ucs_status_t st = ucp_request_check_status(pend[i]);
      if (st == UCS_INPROGRESS) {
        ++i;
        continue;
      }
      ucp_request_free(pend[i]);
      pend[i] = pend.back();
      pend.pop_back();
      if (st != UCS_OK) throw_ucs("ucp request", st);
    }
    return pend.empty();
  };
  // Check before progressing: a receive whose message had already arrived is complete at once.
  // Then requests are checked only after a progress call that did something (or every 64 polls,
  // with the deadline): an idle poll is then one call, which shortens the time between a message
  // landing and this loop seeing it (a latency probe's figure).
  if (sweep()) return true;
  for (unsigned spin = 0;; ++spin) {
    const bool busy = ucp_worker_progress(impl_->worker) != 0;
    const bool slow_tick = (spin & 63u) == 63u;
    if ((busy || slow_tick) && sweep()) return true;
    if (yield) sched_yield();
    if (slow_tick && steady_seconds() > deadline) return false;
  }
}

void UcxWorker::close_endpoints(double deadline) {
  std::vector<void*> closing;
  for (ucp_ep_h ep : impl_->eps) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = 0;  // flush, then close
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing.push_back(r);
  }
  impl_->eps.clear();
  while (!closing.empty()) {
    ucp_worker_progress(impl_->worker);
    for (size_t i = 0; i < closing.size();) {
      if (ucp_request_check_status(closing[i]) == UCS_INPROGRESS) {
        ++i;
        continue;
      }
      ucp_request_free(closing[i]);
      closing[i] = closing.back();
      closing.pop_back();
    }
    if (steady_seconds() > deadline) {
      impl_->abandoned = true;
      return;
    }
  }
}

#else  // built without UCX

bool ucx_available() { return false; }
std::string ucx_version() { return ""; }
static Error no_ucx() {
  return Error("hpctrain was built without UCX", Error::Context{"", "", "install libucx-dev and reconfigure"});
}
std::vector<UcxDevice> ucx_devices() { throw no_ucx(); }
struct UcxWorker::Impl {};
UcxWorker::UcxWorker() { throw no_ucx(); }
UcxWorker::~UcxWorker() = default;
std::vector<char> UcxWorker::address() const { throw no_ucx(); }
int UcxWorker::connect(const std::vector<char>&) { throw no_ucx(); }
void UcxWorker::post_send(int, const void*, size_t, uint64_t) { throw no_ucx(); }
void UcxWorker::post_recv(void*, size_t, uint64_t) { throw no_ucx(); }
bool UcxWorker::wait_all_until(double, bool) { throw no_ucx(); }
void UcxWorker::close_endpoints(double) {}

#endif

}  // namespace hpct::comm
