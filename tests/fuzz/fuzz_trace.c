/* fuzz_trace.c — libFuzzer target for the trace reader of stabmeter-export
 * (harness/trace_reader.c, on HDF5): the input is written to a file and opened exactly as export
 * opens a trace, then every row of every dataset is read. Whatever the bytes, the reader must
 * return within the time limit, never crash, and either accept the file or refuse it with status
 * 2 and a message naming it (1 only for memory). HDF5 itself is not instrumented for coverage:
 * the fuzzer steers by the reader's own branches. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "trace_reader.h"

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

/* A refusal as export reports it: 2 naming the file, or 1 for memory. */
static void check_refusal(int rc, const trace *t, const char *path, const char *when) {
  FUZZ_CHECK(rc == 1 || rc == 2, "%s: status %d, want 0, 1 or 2", when, rc);
  if (rc == 2) FUZZ_CHECK(strstr(t->msg, path) != NULL, "%s: the message does not name the file: %s", when, t->msg);
  else FUZZ_CHECK(strstr(t->msg, "out of memory") != NULL, "%s: status 1 but not out of memory: %s", when, t->msg);
  FUZZ_CHECK(strchr(t->msg, '\n') == NULL, "%s: a message of more than one line: %s", when, t->msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = write_input(data, size);
  trace t;
  trace_init(&t);
  const trace_filter every = {NULL, 0, NULL, 0};
  int rc = trace_open(&t, path, &every);
  if (rc) {
    check_refusal(rc, &t, path, "open");
  } else {
    /* what the schema promises once open */
    FUZZ_CHECK(t.step >= 0 && t.wall.d >= 0 && t.mem >= 0 && t.steps != NULL, "an accepted trace without /step");
    for (size_t l = 0; l < t.n_layers; l++) {
      FUZZ_CHECK(t.layers[l].group && t.layers[l].kind, "layer %zu without its name or kind", l);
      FUZZ_CHECK(t.layers[l].n_cols >= 3, "layer '%s' accepted with %zu datasets, fewer than the 3 required",
                 t.layers[l].group, t.layers[l].n_cols);
    }
    /* The first blocks only: a /step extent of 2^60 rows is valid HDF5 (unwritten chunks read
     * as the fill value), and reading all of it would only time out. */
    for (hsize_t first = 0; first < t.rows && first < 16 * TRACE_BLOCK_ROWS; first += TRACE_BLOCK_ROWS) {
      hsize_t count = t.rows - first < TRACE_BLOCK_ROWS ? t.rows - first : TRACE_BLOCK_ROWS;
      if ((rc = trace_read_block(&t, first, count))) {
        check_refusal(rc, &t, path, "reading rows");
        break;
      }
    }
  }
  trace_close(&t);
  return 0;
}
