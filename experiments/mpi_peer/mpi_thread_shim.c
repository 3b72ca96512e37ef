/* Linked into MPIwrapper by build_mpiwrapper.sh, through MPI's profiling interface (PMPI).
 *
 * XLA's MPI collectives (xla/backends/cpu/collectives/mpi_collectives.cc) initialize MPI with
 * MPI_THREAD_FUNNELED and refuse to run a collective unless MPI_Is_thread_main says the calling
 * thread is the one that initialized MPI. jaxlib's CPU runtime runs a program's thunks on its own
 * worker threads, so any jitted program of more than one step (a bench loop, verify's program)
 * fails with "Communicator requested from a thread that is not the one MPI was initialized
 * from". Here MPI is initialized with MPI_THREAD_MULTIPLE instead, which lets any thread call
 * MPI, and every thread answers as the main one. */
#include <mpi.h>

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
  (void)required;
  return PMPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, provided);
}

int MPI_Is_thread_main(int *flag) {
  *flag = 1;
  return MPI_SUCCESS;
}
