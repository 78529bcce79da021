/* fuzz.h — what the libFuzzer targets in tests/fuzz/ share. A target hands its input to one
 * checkpoint reader as a file, then reads every tensor in full and checks what the reader's
 * documentation promises; any broken promise aborts, which libFuzzer reports as a crash and
 * saves the input. */
#ifndef STAB_FUZZ_H
#define STAB_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "stabmeter.h"

/* Prints "FILE:LINE: check 'COND' failed: MESSAGE" on stderr and aborts. */
void fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
#define FUZZ_CHECK(cond, ...) ((cond) ? (void)0 : fuzz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__))

/* Starts one input: its bytes replace the contents of one memfd kept for the life of the
 * process, so that the readers can open and map it like any file, and heap accounting starts.
 * Returns the memfd's /proc/self/fd path (static storage). */
const char *fuzz_begin(const uint8_t *data, size_t size);

/* Ends one input: the most heap bytes live at once since fuzz_begin must stay within
 * FUZZ_HEAP_PER_BYTE * size + FUZZ_HEAP_SLACK. A reader that allocates on the word of a count
 * or length in the file, before checking it against the file, breaks this long before it
 * reaches libFuzzer's -malloc_limit_mb. */
#define FUZZ_HEAP_PER_BYTE 64
#define FUZZ_HEAP_SLACK (256 * 1024)
void fuzz_end(size_t size);

/* A reader's open failed: st must be STAB_EFORMAT (or STAB_ENOMEM) with a message naming
 * path, and the output pointer (out_is_null) must have been set to NULL. */
void fuzz_check_open_failure(stab_status st, const char *path, int out_is_null);

/* Checks t's fields (name, dtype, shape and count agree, the bytes at t->data are the input's
 * bytes at t->offset), reads all of it through stab_ckpt_read_f32 block by block comparing
 * every value with an independent decoding of the stored bits, checks that out-of-range reads
 * are refused, and hands its pages back with stab_ckpt_release. data and size: the input. */
void fuzz_check_tensor(const stab_ckpt_tensor *t, const uint8_t *data, size_t size);

/* Little-endian loads from the input (unaligned). */
uint32_t fuzz_le32(const uint8_t *p);
uint64_t fuzz_le64(const uint8_t *p);

#endif
