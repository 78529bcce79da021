/* mpi_count.h — the collectives a process makes, counted through MPI's profiling interface.
 * Linking mpi_count.c into a program replaces MPI_Allreduce, MPI_Bcast and MPI_Allgather with
 * wrappers that count while mpi_counting is set and then call PMPI_*, MPI itself; every caller
 * in the process reaches them, libstabmeter_mpi included. For tests and benchmarks, never
 * for the library. */
#ifndef STAB_MPI_COUNT_H
#define STAB_MPI_COUNT_H

extern int mpi_counting;         /* count while non-zero */
extern long mpi_collectives;     /* collectives made while counting */
extern double mpi_reduced_bytes; /* what the counted all-reduces carried, on this rank */

#endif
