// deny_syscalls NAME[>N][,NAME[>N]...] -- CMD [ARGS...]
//
// Runs CMD (and everything it starts) with the named system calls failing with EPERM, the way a
// container's seccomp policy makes them fail: Docker's default profile refuses io_uring_setup, and
// some clusters' containers libaio's io_setup too. With ">N" only calls whose first argument is
// above N fail (io_setup>2: a small libaio queue is granted, a larger one refused, as when
// fs.aio-max-nr is nearly used up). The tests use it to run the async IO engine's `auto` choice,
// and a named engine's refusal, where the kernel really says no.
//
// Known names: io_uring_setup, io_setup. The filter is installed with no_new_privs, so it needs no
// privileges; it is inherited across fork and exec (mpirun's ranks get it too). Only the native
// architecture's calls are filtered (not a 32-bit or x32 binary's).
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

// tests/io/CMakeLists.txt builds this only on these two architectures.
#if defined(__x86_64__)
#define HPCT_NATIVE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define HPCT_NATIVE_ARCH AUDIT_ARCH_AARCH64
#else
#error "deny_syscalls: add this architecture's AUDIT_ARCH_* constant"
#endif
#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425  // the same number on every architecture; older headers lack it
#endif

static const struct {
  const char* name;
  int nr;
} kKnown[] = {{"io_uring_setup", __NR_io_uring_setup}, {"io_setup", __NR_io_setup}};

int main(int argc, char** argv) {
  if (argc < 4 || strcmp(argv[2], "--") != 0) {
    fprintf(stderr, "usage: %s io_uring_setup[,io_setup[>N]] -- CMD [ARGS...]\n", argv[0]);
    return 2;
  }
  enum { kMax = 8 };
  int nrs[kMax], n = 0;
  long above[kMax];  // -1: every call fails; else only calls whose first argument is above it
  for (char* tok = strtok(argv[1], ","); tok; tok = strtok(NULL, ",")) {
    char* gt = strchr(tok, '>');
    long lim = -1;
    if (gt) {
      *gt = 0;
      char* end = NULL;
      lim = strtol(gt + 1, &end, 10);
      if (end == gt + 1 || *end || lim < 0 || lim > 0xFFFFFFFFL) {
        fprintf(stderr, "deny_syscalls: '%s>%s': the limit must be a number in 0..4294967295\n", tok, gt + 1);
        return 2;
      }
    }
    int found = -1;
    for (size_t i = 0; i < sizeof kKnown / sizeof kKnown[0]; ++i)
      if (strcmp(tok, kKnown[i].name) == 0) found = kKnown[i].nr;
    if (found < 0 || n == kMax) {
      fprintf(stderr, "deny_syscalls: unknown system call '%s' (known: io_uring_setup, io_setup)\n", tok);
      return 2;
    }
    nrs[n] = found;
    above[n++] = lim;
  }
  // Another architecture's calls pass untouched; the native ones are compared by number. A listed
  // call returns EPERM (with a limit: when the low 32 bits of its first argument exceed it; both
  // architectures are little-endian) and is otherwise allowed.
  struct sock_filter f[4 + 5 * kMax + 1];
  int k = 0;
  f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
  f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, HPCT_NATIVE_ARCH, 1, 0);
  f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
  for (int i = 0; i < n; ++i) {
    if (above[i] < 0) {
      f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nrs[i], 0, 1);
      f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA));
    } else {
      f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nrs[i], 0, 4);
      f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]));
      f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, (unsigned)above[i], 0, 1);
      f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA));
      f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    }
  }
  f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  struct sock_fprog prog = {(unsigned short)k, f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
    perror("deny_syscalls: installing the seccomp filter");
    return 2;
  }
  execvp(argv[3], argv + 3);
  fprintf(stderr, "deny_syscalls: cannot run %s: %s\n", argv[3], strerror(errno));
  return 127;
}
