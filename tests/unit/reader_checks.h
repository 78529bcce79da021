/* reader_checks.h — what the checkpoint reader tests (check_probe_st, check_probe_gguf,
 * check_mapped_file) check alike: a refused open, and a tensor holding every 16-bit pattern
 * read back against the closed forms of f16 and bf16. Each fails the running test. */
#ifndef STAB_READER_CHECKS_H
#define STAB_READER_CHECKS_H

#include "stabmeter.h"

/* An open that returned status refused the file at path as the readers must: status want,
 * the output pointer set to NULL (out_is_null), and stab_last_error() naming path and
 * holding text ("" for any message). label names the case in a failure. */
void reader_assert_refused(const char *label, const char *path, stab_status status, stab_status want,
                           int out_is_null, const char *text);

/* t holds the 65536 16-bit patterns 0..65535 in order, as bf16 (bf16 = 1) or f16: reads it
 * into out (65536 floats) in uneven blocks, as a caller converting block by block would, and
 * checks every value against its closed form, the sign of zero included. */
void reader_check_all_halves(const stab_ckpt_tensor *t, int bf16, float *out);

#endif /* STAB_READER_CHECKS_H */
