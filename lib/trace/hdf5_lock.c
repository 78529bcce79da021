/* hdf5_lock.c — the process's one lock around HDF5 calls (hdf5_lock.h). trace.c takes it in its
 * fork handlers too, so that a child never starts with it held by a thread it does not have. */
#include "trace/hdf5_lock.h"

#include <pthread.h>

static pthread_mutex_t hdf5_lock = PTHREAD_MUTEX_INITIALIZER;

void stabi_hdf5_lock(void) { pthread_mutex_lock(&hdf5_lock); }

void stabi_hdf5_unlock(void) { pthread_mutex_unlock(&hdf5_lock); }
