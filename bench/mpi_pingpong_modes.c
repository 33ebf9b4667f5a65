// mpi_pingpong_modes.c — where ib_healthcheck's MPI latency gap to NetPIPE comes from: an 8-byte
// ping-pong between 2 ranks with blocking MPI_Send/MPI_Recv (what NetPIPE's NPmpi does; cannot
// time out on a dead peer) against the nonblocking, pollable forms a deadline needs.
//
//   mpicc -O2 bench/mpi_pingpong_modes.c -o /tmp/pp && mpirun -np 2 --bind-to core --map-by core /tmp/pp [funneled]
//
// With "funneled" MPI is initialised with MPI_Init_thread(MPI_THREAD_FUNNELED) instead of MPI_Init
// (single): Open MPI 4.1 then takes a lock in every call. Alternate the two launches to compare.
//
// Each mode runs twice; each run is 21 trials of 20000 round trips; prints the median and the
// minimum over trials of the mean half round trip.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
// 8-byte ping-pong, three ways; prints median over 20 trials of (trial mean half RTT) in ns
static int cmp(const void* a, const void* b) { double x = *(double*)a, y = *(double*)b; return x < y ? -1 : x > y; }
int main(int argc, char** argv) {
  int provided = 0;
  const int funneled = argc > 1 && strcmp(argv[1], "funneled") == 0;
  MPI_Init_thread(&argc, &argv, funneled ? MPI_THREAD_FUNNELED : MPI_THREAD_SINGLE, &provided);
  int r; MPI_Comm_rank(MPI_COMM_WORLD, &r);
  char s[8] = {0}, b[8];
  const int N = 20000, T = 21;
  for (int mode = 0; mode < 5; ++mode) for (int rep = 0; rep < 2; ++rep) {
    double res[T];
    for (int t = 0; t < T; ++t) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < N; ++i) {
        if (mode == 0) {
          if (r == 0) { MPI_Send(s, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD); MPI_Recv(b, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE); }
          else { MPI_Recv(b, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE); MPI_Send(s, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD); }
        } else if (mode == 1) {  // Irecv pre-posted, blocking Send, Test-poll the recv
          MPI_Request q; int f = 0;
          if (r == 0) { MPI_Irecv(b, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD, &q); MPI_Send(s, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD); while (!f) MPI_Test(&q, &f, MPI_STATUS_IGNORE); }
          else { MPI_Irecv(b, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD, &q); while (!f) MPI_Test(&q, &f, MPI_STATUS_IGNORE); MPI_Send(s, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD); }
        } else if (mode == 3) {  // blocking Send; Iprobe-poll, then Recv of the arrived message
          int f = 0;
          if (r == 0) { MPI_Send(s, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD); while (!f) MPI_Iprobe(1, 1, MPI_COMM_WORLD, &f, MPI_STATUS_IGNORE); MPI_Recv(b, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE); }
          else { while (!f) MPI_Iprobe(0, 1, MPI_COMM_WORLD, &f, MPI_STATUS_IGNORE); MPI_Recv(b, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE); MPI_Send(s, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD); }
        } else if (mode == 4) {  // blocking Send; Improbe-poll, then Mrecv
          int f = 0; MPI_Message m;
          if (r == 0) { MPI_Send(s, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD); while (!f) MPI_Improbe(1, 1, MPI_COMM_WORLD, &f, &m, MPI_STATUS_IGNORE); MPI_Mrecv(b, 8, MPI_BYTE, &m, MPI_STATUS_IGNORE); }
          else { while (!f) MPI_Improbe(0, 1, MPI_COMM_WORLD, &f, &m, MPI_STATUS_IGNORE); MPI_Mrecv(b, 8, MPI_BYTE, &m, MPI_STATUS_IGNORE); MPI_Send(s, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD); }
        } else if (mode == 2) {  // what ib_healthcheck does: Irecv + Isend + Testall
          MPI_Request q[2]; int f = 0;
          if (r == 0) { MPI_Irecv(b, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD, &q[0]); MPI_Isend(s, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD, &q[1]); while (!f) MPI_Testall(2, q, &f, MPI_STATUSES_IGNORE); }
          else { MPI_Irecv(b, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD, &q[0]); while (!f) MPI_Testall(1, q, &f, MPI_STATUSES_IGNORE); f = 0; MPI_Isend(s, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD, &q[1]); while (!f) MPI_Testall(1, &q[1], &f, MPI_STATUSES_IGNORE); }
        }
      }
      res[t] = (MPI_Wtime() - t0) / N / 2 * 1e9;
    }
    qsort(res, T, sizeof(double), cmp);
    if (r == 0) printf("%s mode %d (%s): median %.1f ns, min %.1f ns\n", funneled ? "funneled" : "single", mode, mode == 0 ? "Send/Recv (blocking: cannot time out)" : mode == 1 ? "Irecv+Send+Test" : mode == 2 ? "Irecv+Isend+Testall (ib_healthcheck)" : mode == 3 ? "Send+Iprobe+Recv" : "Send+Improbe+Mrecv", res[T / 2], res[0]);
  }
  MPI_Finalize();
}
