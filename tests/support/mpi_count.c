/* mpi_count.c — counting wrappers of the collectives libstabmeter_mpi uses (mpi_count.h). */
#include <mpi.h>

#include "mpi_count.h"

int mpi_counting;
long mpi_collectives;
double mpi_reduced_bytes;

int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  if (mpi_counting) {
    int size = 0;
    PMPI_Type_size(type, &size);
    mpi_collectives++;
    mpi_reduced_bytes += (double)count * size;
  }
  return PMPI_Allreduce(sendbuf, recvbuf, count, type, op, comm);
}

int MPI_Bcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm) {
  mpi_collectives += mpi_counting != 0;
  return PMPI_Bcast(buf, count, type, root, comm);
}

int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount,
                  MPI_Datatype recvtype, MPI_Comm comm) {
  mpi_collectives += mpi_counting != 0;
  return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}
