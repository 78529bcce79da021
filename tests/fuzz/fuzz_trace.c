/* fuzz_trace.c — libFuzzer target for the library's trace reader (lib/trace/read.c, on HDF5),
 * which stabmeter-export and the Python package's read_trace use: the input is written to a file
 * and opened exactly as export opens a trace, then every row of every column is read, block by
 * block as export reads them. Whatever the bytes, the reader must return within the time limit,
 * never crash, and either accept the file or refuse it with a status and a message naming it
 * (STAB_ENOMEM: "out of memory"). HDF5 itself is not instrumented for coverage:
 * the fuzzer steers by the reader's own branches. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "stabmeter.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A directory of this process's own (tmpfs when there is one: the inputs never reach a disk)
 * holding the one input file, rewritten for each input and removed at exit: a plain file at a
 * plain path, as export meets a trace (fuzz_begin's memfd serves the mapped checkpoints). */
static char input_dir[64], input_path[96];

static void remove_input(void) {
  unlink(input_path);
  rmdir(input_dir);
}

static const char *write_input(const uint8_t *data, size_t size) {
  if (!input_dir[0]) {
    snprintf(input_dir, sizeof input_dir, "%s/fuzz_trace.XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    FUZZ_CHECK(mkdtemp(input_dir) != NULL, "cannot create a directory for the input");
    snprintf(input_path, sizeof input_path, "%s/input.h5", input_dir);
    atexit(remove_input);
  }
  int fd = open(input_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FUZZ_CHECK(fd >= 0, "cannot create %s", input_path);
  for (size_t done = 0; done < size;) {
    ssize_t w = write(fd, data + done, size - done);
    FUZZ_CHECK(w > 0, "cannot write the input to %s", input_path);
    done += (size_t)w;
  }
  FUZZ_CHECK(close(fd) == 0, "cannot write the input to %s", input_path);
  return input_path;
}

/* A refusal as the library reports it: STAB_ENOMEM, or an error whose message names the file. */
static void check_refusal(stab_status st, const char *path, const char *when) {
  const char *msg = stab_last_error();
  FUZZ_CHECK(st == STAB_ENOMEM || st == STAB_EFORMAT || st == STAB_EIO, "%s: status %d (%s), want STAB_EFORMAT, STAB_EIO or STAB_ENOMEM", when,
             (int)st, stab_strerror(st));
  if (st != STAB_ENOMEM) FUZZ_CHECK(strstr(msg, path) != NULL, "%s: the message does not name the file: %s", when, msg);
  else FUZZ_CHECK(strstr(msg, "out of memory") != NULL, "%s: STAB_ENOMEM but not out of memory: %s", when, msg);
  FUZZ_CHECK(strchr(msg, '\n') == NULL, "%s: a message of more than one line: %s", when, msg);
}

/* Rows read at a time, as stabmeter-export reads them. */
enum { BLOCK_ROWS = 1024 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = write_input(data, size);
  stab_trace_reader *r = NULL;
  stab_status st = stab_trace_read_open(path, NULL, &r);
  if (st != STAB_OK) {
    FUZZ_CHECK(r == NULL, "a failed open left a reader");
    check_refusal(st, path, "open");
    return 0;
  }
  /* what the schema promises once open */
  const int64_t rows = stab_trace_read_rows(r);
  FUZZ_CHECK(rows >= 0 && stab_trace_read_has_wall_time(r), "an accepted trace without /step or /wall_time");
  for (size_t l = 0; l < stab_trace_read_layer_count(r); l++) {
    const char *name = stab_trace_read_layer_name(r, l);
    FUZZ_CHECK(name && stab_trace_read_layer_kind(r, l), "layer %zu without its name or kind", l);
    FUZZ_CHECK(stab_trace_read_metric_count(r, l) >= 3, "layer '%s' accepted with %zu datasets, fewer than the 3 required",
               name, stab_trace_read_metric_count(r, l));
  }
  /* The first blocks only: a /step extent of 2^60 rows is valid HDF5 (unwritten chunks read
   * as the fill value), and reading all of it would only time out. */
  static int64_t steps[BLOCK_ROWS];
  static double v[BLOCK_ROWS];
  for (int64_t first = 0; first < rows && first < 16 * BLOCK_ROWS && st == STAB_OK; first += BLOCK_ROWS) {
    size_t count = rows - first < BLOCK_ROWS ? (size_t)(rows - first) : BLOCK_ROWS;
    st = stab_trace_read_steps(r, first, count, steps);
    if (st == STAB_OK) st = stab_trace_read_wall_time(r, first, count, v);
    for (size_t s = 0; s < stab_trace_read_scalar_count(r) && st == STAB_OK; s++) st = stab_trace_read_scalar(r, s, first, count, v);
    for (size_t l = 0; l < stab_trace_read_layer_count(r) && st == STAB_OK; l++)
      for (size_t c = 0; c < stab_trace_read_metric_count(r, l) && st == STAB_OK; c++)
        st = stab_trace_read_metric(r, l, c, first, count, v);
    if (st != STAB_OK) check_refusal(st, path, "reading rows");
  }
  /* what read_trace reads besides the rows: run_config, the layers' attributes */
  const char *json = NULL;
  if (st == STAB_OK && (st = stab_trace_read_run_config(r, &json)) != STAB_OK) check_refusal(st, path, "run_config");
  for (size_t l = 0; l < stab_trace_read_layer_count(r) && st == STAB_OK; l++) {
    const stab_trace_attr *attrs = NULL;
    size_t n = 0;
    if ((st = stab_trace_read_layer_attrs(r, l, &attrs, &n)) != STAB_OK) check_refusal(st, path, "layer attributes");
    for (size_t a = 0; a < n && st == STAB_OK; a++) FUZZ_CHECK(attrs[a].name != NULL, "an attribute without its name");
  }
  stab_trace_read_close(r);
  return 0;
}
