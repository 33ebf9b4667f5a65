// Deadline-bounded MPI waits (see deadline.hpp for why nothing is cancelled on a timeout).
#include "hpct/comm/deadline.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "hpct/comm/mpi.hpp"

namespace hpct::comm {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool wait_all_until(MPI_Request* reqs, int n, double deadline, PollPolicy policy) {
  // Reading the clock costs ~20 ns; MPI_Testall on shared memory ~50 ns. Check the clock every
  // 64 polls so a ping-pong's latency is not dominated by the deadline bookkeeping.
  for (unsigned spin = 0;; ++spin) {
    int flag = 0;
    HPCT_CHECK_MPI(MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE));
    if (flag) return true;
    if (policy.yield) sched_yield();
    if ((spin & 63u) == 63u && steady_seconds() > deadline) return false;
  }
}

namespace {

// What the SIGALRM handler needs, prepared before arming: the handler may only make
// async-signal-safe calls, so no allocation or formatting happens there.
char g_alarm_message[1024];
size_t g_alarm_length = 0;
int g_alarm_code = 1;
bool g_alarm_installed = false;
struct sigaction g_alarm_previous;

void on_alarm(int) {
  ssize_t ignored = write(STDERR_FILENO, g_alarm_message, g_alarm_length);
  (void)ignored;
  _exit(g_alarm_code);
}

void set_timer(double seconds) {
  itimerval t{};
  if (seconds > 0) {
    t.it_value.tv_sec = static_cast<time_t>(seconds);
    t.it_value.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(t.it_value.tv_sec)) * 1e6);
    if (t.it_value.tv_sec == 0 && t.it_value.tv_usec == 0) t.it_value.tv_usec = 1;
  }
  setitimer(ITIMER_REAL, &t, nullptr);
}

}  // namespace

AlarmGuard::AlarmGuard(const std::string& message, int exit_code) {
  if (g_alarm_installed) throw Error("AlarmGuard: only one guard may exist at a time");
  std::string line = message + "\n";
  g_alarm_length = std::min(line.size(), sizeof(g_alarm_message));
  std::memcpy(g_alarm_message, line.data(), g_alarm_length);
  g_alarm_code = exit_code;
  struct sigaction sa {};
  sa.sa_handler = on_alarm;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGALRM, &sa, &g_alarm_previous) != 0) throw Error(std::string("AlarmGuard: sigaction: ") + std::strerror(errno));
  g_alarm_installed = true;
}

AlarmGuard::~AlarmGuard() {
  set_timer(0);
  sigaction(SIGALRM, &g_alarm_previous, nullptr);
  g_alarm_installed = false;
}

void AlarmGuard::arm(double seconds) { set_timer(std::max(seconds, 1e-6)); }

void AlarmGuard::disarm() { set_timer(0); }

void isend_string(const std::string& s, int dest, int tag, MPI_Comm comm, std::string& keep, MPI_Request* req) {
  keep = s;
  HPCT_CHECK_MPI(MPI_Isend(keep.data(), static_cast<int>(keep.size()), MPI_BYTE, dest, tag, comm, req));
}

bool recv_string_until(std::string& out, int source, int tag, MPI_Comm comm, double deadline, PollPolicy policy) {
  MPI_Status st;
  for (unsigned spin = 0;; ++spin) {
    int flag = 0;
    HPCT_CHECK_MPI(MPI_Iprobe(source, tag, comm, &flag, &st));
    if (flag) break;
    if (policy.yield) sched_yield();
    if ((spin & 63u) == 63u && steady_seconds() > deadline) return false;
  }
  int count = 0;
  MPI_Get_count(&st, MPI_BYTE, &count);
  std::string buf(static_cast<size_t>(count), '\0');
  // The message is already matched by the probe's envelope; MPI_Recv returns once the bytes land,
  // which for a sender that is alive enough to have sent the envelope is bounded.
  MPI_Request r;
  HPCT_CHECK_MPI(MPI_Irecv(buf.data(), count, MPI_BYTE, st.MPI_SOURCE, tag, comm, &r));
  if (!wait_all_until(&r, 1, deadline + 5.0, policy)) return false;
  out = std::move(buf);
  return true;
}

}  // namespace hpct::comm
