/* out_dir.c — the trainer's --out directory: created on demand, checked before a run spends any
 * time, and the one rule for an earlier run's files there (refused, continued or replaced).
 * Harness code: messages on stderr through cli.h. */
#include "out_dir.h"

#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int mkdirs(const char *path) {
  char p[4096];
  if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return -1;
  for (char *s = p + 1; *s; s++)
    if (*s == '/') {
      *s = 0;
      if (mkdir(p, 0777) && errno != EEXIST) return -1;
      *s = '/';
    }
  return mkdir(p, 0777) && errno != EEXIST ? -1 : 0;
}

/* What a path that is there but of the wrong type is, for the messages of check_out. */
static const char *path_type(mode_t mode) {
  return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" : S_ISREG(mode) ? "a regular file"
         : S_ISCHR(mode) || S_ISBLK(mode) ? "a device" : S_ISSOCK(mode) ? "a socket" : "not a regular file";
}

/* --out DIR, checked before the run spends any time: DIR must be a directory if it exists (or
 * be creatable: no component of it a file), and DIR/trace.h5, when a trace is written, a regular
 * file if it exists. Anything else is bad input: the message and 2; else 0. (mkdir of an
 * existing file fails with EEXIST, which mkdirs takes for a directory already there; and the
 * trace writer refuses a FIFO or a directory at its path only after the model is built.) */
int check_out(const char *dir, int with_trace) {
  struct stat sb;
  char trace[4200];
  if (stat(dir, &sb) != 0) {
    if (errno != ENOTDIR) return 0; /* missing: created; other errors: said when creating it */
    cli_error("--out %s: cannot create the directory: a component of the path is not a directory", dir);
    return CLI_USAGE;
  }
  if (!S_ISDIR(sb.st_mode)) {
    cli_error("--out %s: not a directory: it is %s", dir, path_type(sb.st_mode));
    return CLI_USAGE;
  }
  snprintf(trace, sizeof trace, "%s/trace.h5", dir);
  if (with_trace && stat(trace, &sb) == 0 && !S_ISREG(sb.st_mode)) {
    cli_error("%s: not a regular file: it is %s; the trace cannot go there (remove it, or give "
              "another --out)", trace, path_type(sb.st_mode));
    return CLI_USAGE;
  }
  return 0;
}

/* 1 when name is one of the files a run of this program leaves in its --out: trace.h5,
 * model.safetensors and model.adamw, step-N.safetensors and step-N.adamw. */
static int run_file(const char *name) {
  if (!strcmp(name, "trace.h5") || !strcmp(name, "model.safetensors") || !strcmp(name, "model.adamw")) return 1;
  if (strncmp(name, "step-", 5) || name[5] < '0' || name[5] > '9') return 0;
  const char *ext = name + 5 + strspn(name + 5, "0123456789");
  return !strcmp(ext, ".safetensors") || !strcmp(ext, ".adamw");
}

/* The files of an earlier run in --out DIR, under the one rule for results already there
 * (stab_output_check): a new run (mode STAB_OUTPUT_NEW: neither --resume nor --replace) refuses
 * them all, named, before any time is spent, and keeps them; --resume (APPEND) continues that
 * run and --replace (REPLACE) replaces it, so both go on. Returns 0, or 2 with the message. */
int check_earlier_run(const char *dir, stab_output_mode mode) {
  DIR *d = opendir(dir);
  if (!d) return 0; /* missing: created; other failures: said when creating it */
  char first[3][256], path[4400];
  size_t n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (!run_file(e->d_name) || snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
    if (stab_output_check(path, mode, "a result of an earlier run") != STAB_EEXIST) continue;
    if (n < 3) snprintf(first[n], sizeof first[n], "%s", e->d_name);
    n++;
  }
  closedir(d);
  if (!n) return 0;
  char list[900];
  snprintf(list, sizeof list, "%s%s%s%s%s%s", first[0], n > 1 ? ", " : "", n > 1 ? first[1] : "",
           n > 2 ? ", " : "", n > 2 ? first[2] : "", n > 3 ? ", ..." : "");
  cli_error("--out %s holds an earlier run (%zu file%s: %s): kept as it is; --resume CHECKPOINT continues it, "
            "--replace replaces it, or give another --out", dir, n, n == 1 ? "" : "s", list);
  return CLI_USAGE;
}

/* --replace: the earlier run's files in DIR removed (the trace but when keep_trace: the new
 * trace has replaced it already), so that none of its checkpoints is left beside the new run's.
 * Returns 0, or 1 with the message. */
int remove_earlier_run(const char *dir, int keep_trace) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  char path[4400];
  int rc = 0;
  for (struct dirent *e; (e = readdir(d)) && !rc;) {
    if (!run_file(e->d_name) || (keep_trace && !strcmp(e->d_name, "trace.h5"))) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (unlink(path) != 0 && errno != ENOENT) {
      cli_error("--replace: cannot remove %s: %s", path, strerror(errno));
      rc = 1;
    }
  }
  closedir(d);
  return rc;
}

/* What --out's files may meet: an earlier run replaced, continued or refused. */
stab_output_mode out_mode(const options *o) {
  return o->replace ? STAB_OUTPUT_REPLACE : o->resume ? STAB_OUTPUT_APPEND : STAB_OUTPUT_NEW;
}
