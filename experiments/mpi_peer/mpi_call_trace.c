/* MPI's profiling interface (PMPI) over the point-to-point calls XLA's MPI collectives make
 * (xla/backends/cpu/collectives/mpi_communicator.cc: a collective-permute posts MPI_Irecv, then
 * MPI_Isend, then MPI_Wait on each request in that order): every call's entry and exit on
 * CLOCK_MONOTONIC (Python's time.perf_counter), its peer, count, request and thread, one line a
 * call, appended to "$MPI_CALL_TRACE.<rank>". build_mpi_call_trace.sh makes a copy of MPIwrapper
 * that loads this library first (MPItrampoline opens MPIwrapper with its own libraries first, so
 * a preloaded library would not be seen); steps.py --mpi-trace runs over that copy. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int fd = -1;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void open_trace(void) { /* "$MPI_CALL_TRACE.<rank in MPI_COMM_WORLD>" */
  const char *prefix = getenv("MPI_CALL_TRACE");
  int rank, up;
  char path[4096];
  if (fd >= 0 || !prefix || PMPI_Initialized(&up) != MPI_SUCCESS || !up) return;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  snprintf(path, sizeof path, "%s.%d", prefix, rank);
  fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
}

static void emit(const char *call, double t0, double t1, int peer, int bytes, const void *req) {
  char line[200];
  int n;
  open_trace();
  if (fd < 0) return;
  n = snprintf(line, sizeof line, "%s %.6f %.6f %d %d %p %ld\n", call, t0, t1, peer, bytes, req,
               (long)syscall(SYS_gettid));
  if (write(fd, line, (size_t)n) < 0) return;
}

int MPI_Irecv(void *buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
              MPI_Request *request) {
  double t0 = now();
  int rc = PMPI_Irecv(buf, count, type, source, tag, comm, request);
  emit("irecv", t0, now(), source, count, (const void *)*request);
  return rc;
}

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request *request) {
  double t0 = now();
  int rc = PMPI_Isend(buf, count, type, dest, tag, comm, request);
  emit("isend", t0, now(), dest, count, (const void *)*request);
  return rc;
}

int MPI_Wait(MPI_Request *request, MPI_Status *status) {
  const void *req = (const void *)*request;
  double t0 = now();
  int rc = PMPI_Wait(request, status);
  emit("wait", t0, now(), -1, 0, req);
  return rc;
}
