#!/bin/sh
# The monitor's cost per step on P MPI ranks on this machine, and a model of P up to 1024:
# bench/mpi_scaling (built here if needed) under mpirun at P = 1 with 1 and 2 threads and at
# P = 2 with 1 thread a rank (this machine's two cores either way). Each run prints the
# data-parallel step (stab_mpi_monitor_measure on a GPT-2-124M-shaped model), the
# tensor-parallel warm estimates of a block's four linears with the per-pass exchange alone,
# the model of the MLP's first linear's pass on P ranks of a network (--alpha US, --beta
# GB/s; default InfiniBand EDR), and a step's split linears (--batch-blocks B blocks x 6,
# default 4) measured batched (stab_mpi_linear_measure_batch) and one by one, with the
# collectives each way and their model on P ranks. Usage: bench/mpi_scaling.sh
# [bench/mpi_scaling options, e.g. --width 4096 --blocks 2 --alpha 1.5 --beta 25, or
# --batch-only]; run from the top of a tree configured --with-mpi. Prints the load average
# with each run.
set -eu
[ -f lib/libstabmeter_mpi.la ] || { echo "mpi_scaling.sh: configure --with-mpi and build first" >&2; exit 2; }
make -s bench/mpi_scaling >&2 || exit 1
command -v mpirun >/dev/null || { echo "mpi_scaling.sh: no mpirun (Debian: openmpi-bin)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# mpirun binds a rank to one core by default: the 2-thread rank is left unbound, or its
# threads would share one core
echo "== P = 1, 2 threads"
mpirun -np 1 --bind-to none ./bench/mpi_scaling --threads 2 "$@"
echo "== P = 1, 1 thread"
mpirun -np 1 ./bench/mpi_scaling --threads 1 "$@"
echo "== P = 2, 1 thread a rank"
mpirun -np 2 --bind-to core ./bench/mpi_scaling --threads 1 "$@"
