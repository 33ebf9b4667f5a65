// allreduce_modes.c — where ib_healthcheck's all-reduce figure stands against point-to-point on one
// host: a single MPI_Send/MPI_Recv of the buffer, blocking MPI_Allreduce, MPI_Iallreduce polled
// with MPI_Test, and a chunked ring all-reduce (reduce-scatter through a two-chunk scratch, then
// all-gather; the algorithm of hpct::comm::RingAllreduce, written out here without its deadline
// waits), with plain or non-temporal stores (NT=1).
//
//   mpicc -O3 -march=native bench/allreduce_modes.c -o /tmp/arm
//   mpirun -np 2 --bind-to core --map-by core /tmp/arm [MiB=64] [reps=6] [chunk KiB=1024]
//   NT=1 mpirun -x NT -np 2 --bind-to core --map-by core /tmp/arm 64 6 1024
//
// Each mode: best of `reps` timed runs (after one warm-up), the slowest rank's time; prints the
// bandwidth of the send and the busbw of the all-reduces (nccl-tests: algbw x 2(n-1)/n). Results
// are checked (integer-valued data, exact sums). Compare the ratio ring / p2p within one launch.
// Last, "add": each rank's local share of the ring's arithmetic alone (its segment, (n-1)/n of the
// buffer, added out = in + scratch with the same stores), no communication. On 2 ranks the ring's
// core copies what the send copies (half in, half back) and adds on top, so with the send's time
// t_p2p and this time t_add, busbw / p2p cannot exceed t_p2p / (t_p2p + t_add): printed as "bound".
#include <immintrin.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void wait_all(MPI_Request* r, int n) {
  int done = 0;
  while (!done) MPI_Testall(n, r, &done, MPI_STATUSES_IGNORE);
}

static size_t seg_begin(size_t count, int n, int r) {
  size_t seg = (count + n - 1) / n;
  seg = (seg + 15) / 16 * 16;
  size_t b = seg * (size_t)r;
  return b < count ? b : count;
}

static void add_into(float* d, const float* a, const float* t, size_t len, int nt) {
  size_t i = 0;
  if (nt) {
    for (; i < len && ((uintptr_t)(d + i) & 15u); ++i) d[i] = a[i] + t[i];
    for (; i + 4 <= len; i += 4) _mm_stream_ps(d + i, _mm_add_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(t + i)));
    _mm_sfence();
  }
  for (; i < len; ++i) d[i] = a[i] + t[i];
}

static void ring(const float* in, float* out, size_t count, size_t chunk, float* scratch, int nt) {
  int r, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int right = (r + 1) % n, left = (r - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {  // reduce-scatter
    int ss = ((r - s) % n + n) % n, rs = ((r - s - 1) % n + n) % n;
    size_t sb = seg_begin(count, n, ss), se = seg_begin(count, n, ss + 1);
    size_t rb = seg_begin(count, n, rs), re = seg_begin(count, n, rs + 1);
    const float* src = s == 0 ? in : out;
    size_t nsend = (se - sb + chunk - 1) / chunk, nrecv = (re - rb + chunk - 1) / chunk;
    MPI_Request* sq = malloc((nsend + 1) * sizeof(MPI_Request));
    for (size_t k = 0; k < nsend; ++k) {
      size_t o = sb + k * chunk, l = se - o < chunk ? se - o : chunk;
      MPI_Isend(src + o, (int)l, MPI_FLOAT, right, 1, MPI_COMM_WORLD, &sq[k]);
    }
    MPI_Request rq[2];
    for (size_t k = 0; k < nrecv && k < 2; ++k) {
      size_t o = rb + k * chunk, l = re - o < chunk ? re - o : chunk;
      MPI_Irecv(scratch + (k & 1) * chunk, (int)l, MPI_FLOAT, left, 1, MPI_COMM_WORLD, &rq[k & 1]);
    }
    for (size_t k = 0; k < nrecv; ++k) {
      wait_all(&rq[k & 1], 1);
      size_t o = rb + k * chunk, l = re - o < chunk ? re - o : chunk;
      add_into(out + o, in + o, scratch + (k & 1) * chunk, l, nt);
      if (k + 2 < nrecv) {
        size_t o2 = rb + (k + 2) * chunk, l2 = re - o2 < chunk ? re - o2 : chunk;
        MPI_Irecv(scratch + (k & 1) * chunk, (int)l2, MPI_FLOAT, left, 1, MPI_COMM_WORLD, &rq[k & 1]);
      }
    }
    wait_all(sq, (int)nsend);
    free(sq);
  }
  for (int s = 0; s < n - 1; ++s) {  // all-gather
    int ss = ((r + 1 - s) % n + n) % n, rs = ((r - s) % n + n) % n;
    size_t sb = seg_begin(count, n, ss), se = seg_begin(count, n, ss + 1);
    size_t rb = seg_begin(count, n, rs), re = seg_begin(count, n, rs + 1);
    MPI_Request q[2];
    MPI_Irecv(out + rb, (int)(re - rb), MPI_FLOAT, left, 2, MPI_COMM_WORLD, &q[0]);
    MPI_Isend(out + sb, (int)(se - sb), MPI_FLOAT, right, 2, MPI_COMM_WORLD, &q[1]);
    wait_all(q, 2);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int r, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const size_t bytes = (size_t)(argc > 1 ? atol(argv[1]) : 64) << 20, count = bytes / 4;
  const int reps = argc > 2 ? atoi(argv[2]) : 6;
  const size_t chunk = (size_t)(argc > 3 ? atol(argv[3]) : 1024) * 1024 / 4;
  const int nt = getenv("NT") != NULL;
  float *in = aligned_alloc(64, bytes), *out = aligned_alloc(64, bytes), *scratch = aligned_alloc(64, 2 * chunk * 4);
  for (size_t i = 0; i < count; ++i) in[i] = (float)((r * 7 + i * 13) % 61);
  memset(out, 0, bytes);
  memset(scratch, 0, 2 * chunk * 4);
  const char* names[] = {"p2p", "MPI_Allreduce", "MPI_Iallreduce", "ring"};
  int failed = 0;
  double t_p2p = 0;
  for (int m = 0; m < 4; ++m) {
    double best = 1e30;
    for (int it = 0; it <= reps; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t = MPI_Wtime();
      if (m == 0) {
        if (r == 0) MPI_Send(in, (int)count, MPI_FLOAT, 1, 7, MPI_COMM_WORLD);
        else if (r == 1) MPI_Recv(out, (int)count, MPI_FLOAT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else if (m == 1) {
        MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      } else if (m == 2) {
        MPI_Request q;
        MPI_Iallreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q);
        wait_all(&q, 1);
      } else {
        ring(in, out, count, chunk, scratch, nt);
      }
      t = MPI_Wtime() - t;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (it > 0 && t < best) best = t;
    }
    if (m > 0) {
      for (size_t i = 0; i < count; i += 997) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += (float)((q * 7 + i * 13) % 61);
        if (out[i] != want) { failed = 1; break; }
      }
    }
    double bw = bytes / best / 1e9, fig = m == 0 ? bw : bw * 2.0 * (n - 1) / n;
    if (r == 0) printf("%-15s %8.2f ms  %s %.2f GB/s%s\n", names[m], best * 1e3, m == 0 ? "bw   " : "busbw", fig,
                       m == 3 ? (nt ? " (non-temporal stores)" : " (plain stores)") : "");
    if (m == 0) t_p2p = best;
  }
  {  // the ring's arithmetic alone: this rank adds (n-1)/n of the buffer, chunk by chunk through scratch
    const size_t len = count - count / (size_t)n;
    memcpy(scratch, in, 2 * chunk * sizeof(float) < bytes ? 2 * chunk * sizeof(float) : bytes);
    double best = 1e30;
    for (int it = 0; it <= reps; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t = MPI_Wtime();
      for (size_t o = 0; o < len; o += chunk) {  // scratch stands in for the received chunk, in cache as in the ring
        size_t l = len - o < chunk ? len - o : chunk;
        add_into(out + o, in + o, scratch + (o / chunk & 1) * chunk, l, nt);
      }
      t = MPI_Wtime() - t;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (it > 0 && t < best) best = t;
    }
    if (r == 0) printf("%-15s %8.2f ms  bound busbw / p2p <= %.2f (t_p2p / (t_p2p + t_add), 2 ranks)\n", "add", best * 1e3,
                       t_p2p / (t_p2p + best));
  }
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (r == 0 && failed) printf("WRONG RESULT\n");
  MPI_Finalize();
  return failed;
}
