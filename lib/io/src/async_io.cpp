// The async IO engine: request splitting, worker threads, and the three kernel backends (its
// buffers and files are in io_file.cpp).
#include "hpct/io/async_io.hpp"

#include <fcntl.h>
#include <libaio.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <unordered_set>

#include "hpct/core/error.hpp"
#include "hpct/core/units.hpp"

namespace hpct::io {

// ---------------------------------------------------------------------------------------------
// Requests, pieces and kernel backends

namespace detail {

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

struct Request {
  std::string path;
  bool write = false;
  uint64_t off = 0;
  size_t len = 0;
  std::atomic<size_t> remaining{0};
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;  // the first piece's error, already formatted

  void piece_done(const std::string* err) {
    if (err) {
      std::lock_guard lk(mu);
      if (error.empty()) error = *err;
    }
    if (remaining.fetch_sub(1) == 1) {
      {
        std::lock_guard lk(mu);
        done = true;
      }
      // After the unlock: a waiter woken while the lock is still held would only block again on
      // it, one more sleep and wake-up per request. The caller of piece_done keeps *this alive.
      cv.notify_all();
    }
  }
};

struct Piece {
  std::shared_ptr<Request> req;
  const IoFile* file = nullptr;
  bool write = false;
  char* buf = nullptr;
  size_t len = 0;
  uint64_t off = 0;
  uint64_t t_submit = 0;
  uint64_t t_done = 0;  // when the kernel's completion was reaped (latency ends there)
  int fd() const {
    size_t a = file->alignment();
    bool aligned = file->direct() && reinterpret_cast<uintptr_t>(buf) % a == 0 && off % a == 0 && len % a == 0;
    return aligned ? file->direct_fd() : file->buffered_fd();
  }
};

using Completion = std::pair<Piece*, long>;  // piece, bytes transferred or -errno

class Backend {
 public:
  virtual ~Backend() = default;
  virtual void prepare(Piece* p) = 0;                         // queue for the next flush
  virtual void flush(std::vector<Completion>& failed) = 0;    // hand prepared pieces to the kernel
  virtual void reap(int min, std::vector<Completion>& out) = 0;  // wait for >= min completions
  virtual bool synchronous() const { return false; }  // flush does the IO itself (psync)
};

// How often a submission refused with EAGAIN (the kernel short of resources for the moment) is
// retried, yielding in between, before the queue is declared broken.
constexpr int kSubmitRetries = 10000;

class UringBackend final : public Backend {
 public:
  explicit UringBackend(int depth) {
    int rc = io_uring_queue_init(static_cast<unsigned>(depth), &ring_, 0);
    if (rc < 0)
      throw config_error("aio.engine", std::string("io_uring_queue_init: ") + std::strerror(-rc),
                         "this kernel or its seccomp policy refuses io_uring; use libaio or psync");
  }
  ~UringBackend() override { io_uring_queue_exit(&ring_); }
  void prepare(Piece* p) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (!sqe) throw Error("io_uring: submission queue full (engine bug: more in flight than queue_depth)");
    if (p->write) io_uring_prep_write(sqe, p->fd(), p->buf, static_cast<unsigned>(p->len), p->off);
    else io_uring_prep_read(sqe, p->fd(), p->buf, static_cast<unsigned>(p->len), p->off);
    io_uring_sqe_set_data(sqe, p);
    prepared_.push_back(p);
  }
  void flush(std::vector<Completion>&) override {
    // Per-request errors come back in completions; a failed submit is the ring's, and its entries
    // stay in the ring, so it cannot be reported per piece and carried on from: it breaks the queue
    // (the worker then fails every piece it holds, and every later one).
    int again = 0;
    while (!prepared_.empty()) {
      int rc = io_uring_submit(&ring_);
      if (rc == -EINTR) continue;
      if (rc == -EAGAIN && ++again < kSubmitRetries) {
        sched_yield();
        continue;
      }
      if (rc <= 0)
        throw Error(std::string("io_uring_submit: ") + (rc < 0 ? std::strerror(-rc) : "no entry was taken") + " (" +
                    std::to_string(prepared_.size()) + " requests waiting)");
      prepared_.erase(prepared_.begin(), prepared_.begin() + std::min<size_t>(rc, prepared_.size()));
    }
  }
  void reap(int min, std::vector<Completion>& out) override {
    int got = 0;
    while (got < min) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) throw Error(std::string("io_uring_wait_cqe: ") + std::strerror(-rc));
      unsigned head, n = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        out.emplace_back(static_cast<Piece*>(io_uring_cqe_get_data(cqe)), cqe->res);
        ++n;
      }
      io_uring_cq_advance(&ring_, n);
      got += static_cast<int>(n);
    }
  }

 private:
  io_uring ring_{};
  std::vector<Piece*> prepared_;
};

class AioBackend final : public Backend {
 public:
  explicit AioBackend(int depth) : cbs_(depth), events_(depth) {
    int rc = io_setup(depth, &ctx_);
    if (rc < 0)
      throw config_error("aio.engine", std::string("io_setup: ") + std::strerror(-rc),
                         "raise /proc/sys/fs/aio-max-nr or lower queue_depth x threads, or use io_uring");
    for (int i = depth - 1; i >= 0; --i) free_.push_back(i);
  }
  ~AioBackend() override { io_destroy(ctx_); }
  void prepare(Piece* p) override {
    if (free_.empty()) throw Error("libaio: no free iocb (engine bug: more in flight than queue_depth)");
    int slot = free_.back();
    free_.pop_back();
    iocb* cb = &cbs_[slot];
    if (p->write) io_prep_pwrite(cb, p->fd(), p->buf, p->len, static_cast<long long>(p->off));
    else io_prep_pread(cb, p->fd(), p->buf, p->len, static_cast<long long>(p->off));
    cb->data = p;
    prepared_.push_back(cb);
  }
  void flush(std::vector<Completion>& failed) override {
    size_t done = 0;
    int again = 0;
    while (done < prepared_.size()) {
      int rc = io_submit(ctx_, static_cast<long>(prepared_.size() - done), prepared_.data() + done);
      if (rc == -EINTR) continue;
      if (rc == -EAGAIN && ++again < kSubmitRetries) {
        sched_yield();
        continue;
      }
      if (rc <= 0) {
        for (size_t i = done; i < prepared_.size(); ++i) {
          failed.emplace_back(static_cast<Piece*>(prepared_[i]->data), rc < 0 ? rc : -EIO);
          free_.push_back(static_cast<int>(prepared_[i] - cbs_.data()));
        }
        break;
      }
      done += static_cast<size_t>(rc);
    }
    prepared_.clear();
  }
  void reap(int min, std::vector<Completion>& out) override {
    int got = 0;
    while (got < min) {
      int rc = io_getevents(ctx_, min - got, static_cast<long>(events_.size()), events_.data(), nullptr);
      if (rc == -EINTR) continue;
      if (rc < 0) throw Error(std::string("io_getevents: ") + std::strerror(-rc));
      for (int i = 0; i < rc; ++i) {
        iocb* cb = events_[i].obj;
        free_.push_back(static_cast<int>(cb - cbs_.data()));
        out.emplace_back(static_cast<Piece*>(events_[i].data), static_cast<long>(events_[i].res));
      }
      got += rc;
    }
  }

 private:
  io_context_t ctx_{};
  std::vector<iocb> cbs_;
  std::vector<io_event> events_;
  std::vector<int> free_;
  std::vector<iocb*> prepared_;
};

// psync: the "queue" runs each piece synchronously at flush; completions are ready at once.
class PsyncBackend final : public Backend {
 public:
  void prepare(Piece* p) override { prepared_.push_back(p); }
  void flush(std::vector<Completion>&) override {
    for (Piece* p : prepared_) {
      ssize_t rc;
      do {
        rc = p->write ? ::pwrite(p->fd(), p->buf, p->len, static_cast<off_t>(p->off))
                      : ::pread(p->fd(), p->buf, p->len, static_cast<off_t>(p->off));
      } while (rc < 0 && errno == EINTR);
      done_.emplace_back(p, rc < 0 ? -errno : rc);
    }
    prepared_.clear();
  }
  void reap(int, std::vector<Completion>& out) override {
    out.insert(out.end(), done_.begin(), done_.end());
    done_.clear();
  }
  bool synchronous() const override { return true; }

 private:
  std::vector<Piece*> prepared_;
  std::vector<Completion> done_;
};

// The engine's threads leave process-directed signals (Ctrl-C, scancel's SIGTERM) to the
// application's own threads, whose handlers can then clean up without an IO thread racing them:
// they start with every asynchronous signal blocked (faults still reach the thread that caused them).
template <class F>
std::thread start_with_signals_blocked(F&& f) {
  sigset_t all, old;
  sigfillset(&all);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS}) sigdelset(&all, s);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  try {
    std::thread t(std::forward<F>(f));
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return t;
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    throw;
  }
}

class Worker {
 public:
  Worker(const AioConfig& cfg, const std::atomic<bool>* recording) : cfg_(cfg), recording_(recording) {
    int depth = cfg.engine == AioEngine::psync ? 1 : cfg.queue_depth;
    switch (cfg.engine) {
      case AioEngine::io_uring: backend_ = std::make_unique<UringBackend>(depth); break;
      case AioEngine::libaio: backend_ = std::make_unique<AioBackend>(depth); break;
      case AioEngine::psync: backend_ = std::make_unique<PsyncBackend>(); break;
      case AioEngine::automatic: throw Error("IO engine worker: the engine was not resolved (engine bug)");
    }
    depth_ = depth;
    thread_ = start_with_signals_blocked([this] { run(); });
  }
  ~Worker() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void enqueue(std::vector<Piece*>& pieces) {
    {
      std::lock_guard lk(mu_);
      for (Piece* p : pieces) pending_.push_back(p);
    }
    cv_.notify_one();
  }
  void take_latencies(std::vector<uint64_t>& out) {
    std::lock_guard lk(lat_mu_);
    out.insert(out.end(), latencies_.begin(), latencies_.end());
    latencies_.clear();
  }

 private:
  void run() {
    try {
      loop();
    } catch (const std::exception& e) {
      // A broken kernel queue (not a failed IO: those come back per piece). Fail everything this
      // worker holds and every later piece, so no waiter hangs.
      std::string msg = std::string("IO engine worker failed: ") + e.what();
      std::unique_lock lk(mu_);
      for (;;) {
        for (Piece* p : inflight_set_) fail(p, msg);
        inflight_set_.clear();
        while (!pending_.empty()) {
          fail(pending_.front(), msg);
          pending_.pop_front();
        }
        if (stop_) return;
        cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
      }
    }
  }

  static void fail(Piece* p, const std::string& msg) {
    std::string m = p->req->path + ": " + msg;
    p->req->piece_done(&m);
    delete p;
  }

  void loop() {
    std::vector<Piece*> batch;
    std::vector<Completion> done, refused;
    int inflight = 0;
    for (;;) {
      batch.clear();
      {
        std::unique_lock lk(mu_);
        if (inflight == 0 && done.empty()) cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
        if (inflight == 0 && done.empty() && pending_.empty() && stop_) return;
        int room = cfg_.overlap_events ? depth_ - inflight : (inflight == 0 ? depth_ : 0);
        while (room-- > 0 && !pending_.empty()) {
          batch.push_back(pending_.front());
          pending_.pop_front();
        }
      }
      // A synchronous backend does the IO in flush: deliver what is done before it, not after.
      if (backend_->synchronous()) deliver(done);
      // All of the batch is registered before any of it is prepared, so if preparing throws, the
      // failure path finds every piece.
      for (Piece* p : batch) inflight_set_.insert(p);
      for (Piece* p : batch) {
        p->t_submit = now_ns();
        backend_->prepare(p);
        if (cfg_.single_submit) backend_->flush(refused);
      }
      if (!cfg_.single_submit && !batch.empty()) backend_->flush(refused);
      inflight += static_cast<int>(batch.size()) - static_cast<int>(refused.size());
      // What the last reap returned is delivered only now, after the queue is topped up: waking a
      // waiter is a syscall (on a VM an inter-processor interrupt too), and at queue depth 1 it
      // would otherwise sit between one request's completion and the next one's submission.
      for (auto& [p, res] : refused) complete(p, res, now_ns());
      refused.clear();
      deliver(done);
      if (inflight > 0) {
        backend_->reap(cfg_.overlap_events ? 1 : inflight, done);
        inflight -= static_cast<int>(done.size());
        const uint64_t t = now_ns();
        for (auto& c : done) c.first->t_done = t;
      }
    }
  }

  void deliver(std::vector<Completion>& done) {
    for (auto& [p, res] : done) complete(p, res, p->t_done);
    done.clear();
  }

  void complete(Piece* p, long res, uint64_t t) {
    inflight_set_.erase(p);
    if (res == static_cast<long>(p->len)) {
      if (recording_->load(std::memory_order_relaxed)) {
        std::lock_guard lk(lat_mu_);
        latencies_.push_back(t - p->t_submit);
      }
      p->req->piece_done(nullptr);
      delete p;
      return;
    }
    if (res > 0) {  // short transfer with progress: resubmit the rest (bounded: each round advances)
      p->buf += res;
      p->off += static_cast<uint64_t>(res);
      p->len -= static_cast<size_t>(res);
      std::lock_guard lk(mu_);
      pending_.push_front(p);
      return;
    }
    const Request& r = *p->req;
    std::string what = std::string(r.write ? "write" : "read") + " of " + std::to_string(r.len) + " bytes at offset " +
                       std::to_string(r.off) + " failed at offset " + std::to_string(p->off) + " (" +
                       std::to_string(p->len) + " bytes left in this piece): ";
    if (res < 0) {
      what += std::strerror(static_cast<int>(-res));
      if (res == -ENOSPC) what += " (the device is full)";
      if (res == -EFBIG) what += " (the file size limit, ulimit -f, was reached)";
      if (res == -EINVAL) what += " (misaligned direct IO, or an offset past the device's limit)";
    } else {
      what += r.write ? "the kernel wrote 0 bytes (device full?)" : "end of file (the file is shorter than the request)";
    }
    std::string msg = r.path + ": " + what;
    p->req->piece_done(&msg);
    delete p;
  }

  AioConfig cfg_;
  const std::atomic<bool>* recording_;
  std::unique_ptr<Backend> backend_;
  int depth_ = 1;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Piece*> pending_;
  std::unordered_set<Piece*> inflight_set_;  // handed to the kernel, not yet completed (worker thread only)
  bool stop_ = false;
  std::mutex lat_mu_;
  std::vector<uint64_t> latencies_;
  std::thread thread_;
};

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// AsyncIo

AsyncIo::AsyncIo(const AioConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  std::string skipped;
  cfg_.engine = resolve_engine(cfg.engine, &skipped);
  // The probe behind `auto` used a small queue; this one may be refused where it was not (libaio
  // past fs.aio-max-nr, an io_uring ring past RLIMIT_MEMLOCK on old kernels). Then `auto` goes on
  // to the next engine; a named engine's refusal is the caller's error.
  bool retried = false;
  for (;;) {
    try {
      for (int t = 0; t < cfg_.thread_count; ++t) workers_.push_back(std::make_unique<detail::Worker>(cfg_, &recording_));
      break;
    } catch (const Error& e) {
      workers_.clear();
      if (cfg.engine != AioEngine::automatic || cfg_.engine == AioEngine::psync) throw;
      skipped += std::string(skipped.empty() ? "" : "; ") + engine_name(cfg_.engine) + ": " + e.what();
      cfg_.engine = cfg_.engine == AioEngine::io_uring ? AioEngine::libaio : AioEngine::psync;
      retried = true;
    }
  }
  if (skipped.empty()) return;
  auto say = [&] { std::fprintf(stderr, "hpctrain: async IO engine auto: using %s (%s)\n", engine_name(cfg_.engine), skipped.c_str()); };
  if (retried) {  // particular to this queue: every time
    say();
    return;
  }
  static std::once_flag said;  // the kernel's refusal: once per process
  std::call_once(said, say);
}

AsyncIo::~AsyncIo() {
  try {
    wait_all();
  } catch (...) {
  }
  workers_.clear();
}

void AsyncIo::record_latencies(bool on) { recording_.store(on); }

std::vector<uint64_t> AsyncIo::take_latencies_ns() {
  std::vector<uint64_t> out;
  for (auto& w : workers_) w->take_latencies(out);
  return out;
}

AsyncIo::Ticket AsyncIo::submit_read(const IoFile& file, void* buf, size_t len, uint64_t off) {
  return submit(file, static_cast<char*>(buf), len, off, false);
}

AsyncIo::Ticket AsyncIo::submit_write(const IoFile& file, const void* buf, size_t len, uint64_t off) {
  // The engine never writes into a write's buffer; the cast only lets one Piece type serve both.
  return submit(file, const_cast<char*>(static_cast<const char*>(buf)), len, off, true);
}

AsyncIo::Ticket AsyncIo::submit(const IoFile& file, char* buf, size_t len, uint64_t off, bool write) {
  if (file.direct_fd() < 0) throw file_error(file.path(), "IO submitted on a closed file");
  size_t a = file.alignment();
  if (file.direct() && (reinterpret_cast<uintptr_t>(buf) % a != 0 || off % a != 0)) {
    char addr[32];
    std::snprintf(addr, sizeof addr, "%p", static_cast<void*>(buf));
    throw file_error(file.path(),
                     std::string(write ? "write" : "read") + " at offset " + std::to_string(off) + " with buffer " + addr +
                         " is not aligned to " + std::to_string(a) + " bytes, as O_DIRECT requires",
                     "use AlignedBuffer/BufferPool buffers and offsets that are multiples of " + std::to_string(a));
  }
  auto req = std::make_shared<detail::Request>();
  req->path = file.path();
  req->write = write;
  req->off = off;
  req->len = len;

  std::vector<detail::Piece*> pieces;
  size_t body = file.direct() ? len - len % a : len;
  for (size_t pos = 0; pos < body; pos += cfg_.block_size) {
    auto* p = new detail::Piece{req, &file, write, buf + pos, std::min(cfg_.block_size, body - pos), off + pos, 0};
    pieces.push_back(p);
  }
  if (body < len) pieces.push_back(new detail::Piece{req, &file, write, buf + body, len - body, off + body, 0});

  Ticket t;
  {
    std::lock_guard lk(mu_);
    t = next_++;
    if (pieces.empty()) {
      req->done = true;
    } else {
      req->remaining = pieces.size();
    }
    requests_.emplace(t, req);
  }
  if (pieces.empty()) return t;

  // Contiguous runs per worker (intra-op parallelism) for large requests; round-robin for small.
  size_t nw = workers_.size(), np = pieces.size();
  std::vector<std::vector<detail::Piece*>> per(nw);
  for (size_t i = 0; i < np; ++i) {
    size_t w = np >= nw ? i * nw / np : (rr_ + i) % nw;
    per[w].push_back(pieces[i]);
  }
  if (np < nw) rr_ = (rr_ + np) % nw;
  for (size_t w = 0; w < nw; ++w)
    if (!per[w].empty()) workers_[w]->enqueue(per[w]);
  return t;
}

bool AsyncIo::test(Ticket t) {
  std::shared_ptr<detail::Request> r;
  {
    std::lock_guard lk(mu_);
    auto it = requests_.find(t);
    if (it == requests_.end()) return true;
    r = it->second;
  }
  std::lock_guard lk(r->mu);
  return r->done;
}

void AsyncIo::wait(Ticket t) {
  std::shared_ptr<detail::Request> r;
  {
    std::lock_guard lk(mu_);
    auto it = requests_.find(t);
    if (it == requests_.end()) return;
    r = it->second;
  }
  std::string err;
  {
    std::unique_lock lk(r->mu);
    r->cv.wait(lk, [&] { return r->done; });
    err = r->error;
  }
  {
    std::lock_guard lk(mu_);
    requests_.erase(t);
  }
  if (!err.empty()) {
    // The message already starts with the path; keep the file in the context for callers.
    throw Error(err, Error::Context{"", "", ""});
  }
}

void AsyncIo::wait_all() {
  std::vector<Ticket> ts;
  {
    std::lock_guard lk(mu_);
    for (const auto& [t, r] : requests_) ts.push_back(t);
  }
  std::string first;
  for (Ticket t : ts) {
    try {
      wait(t);
    } catch (const Error& e) {
      if (first.empty()) first = e.message();
    }
  }
  if (!first.empty()) throw Error(first);
}

size_t AsyncIo::outstanding() const {
  std::lock_guard lk(mu_);
  return requests_.size();
}

}  // namespace hpct::io
