/* hdf5_lock.h — one thread in HDF5 at a time in the whole process, shared by the trace's writer
 * (lib/trace/, trace_internal.h) and its reader (lib/trace/read.c): HDF5 is thread-safe only when
 * built so, and a trace's writer thread writes while the caller opens, reads or closes another
 * trace. Defined in hdf5_util.c. Not recursive: taken around HDF5 calls only, never around a call
 * back into the library. */
#ifndef STABMETER_TRACE_HDF5_LOCK_H
#define STABMETER_TRACE_HDF5_LOCK_H

void stabi_trace_hdf5_lock_take(void);
void stabi_trace_hdf5_lock_give(void);

#endif /* STABMETER_TRACE_HDF5_LOCK_H */
