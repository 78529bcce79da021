/* sweep.c — the trainer's sweeps: one run per width (--sweep-widths) and/or learning rate
 * (--sweep-lrs), each into a directory of its own under --out, the earlier runs' files checked
 * first; the widths' per-kind log-log slopes and the rates' held-out losses compared on stdout,
 * the latter also in DIR/lr-sweep.csv. Harness code. */
#include "sweep.h"

#include "cli.h"
#include "out_dir.h"
#include "run.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The width sweep's result: per layer kind and metric, the last quarter's geometric mean at
 * each width and the least-squares slope of log(metric) against log(width). A slope near 0
 * means the metric does not change with width, which is what a stable parametrisation gives. */
static void print_sweep(const options *o, double lr, const kind_means *means) {
  static const char *const metric[3] = {"forward", "dependency", "update"};
  char rate[40] = "";
  if (o->n_sweep_lr) snprintf(rate, sizeof rate, ", lr %g", lr);
  printf("sweep (%s%s): geometric mean over each kind's layers and the measured steps of the last "
         "quarter, against width\n%-10s %-10s", o->optimizer == OPTIM_ADAMW ? "adamw" : "steepest", rate,
         "kind", "metric");
  for (size_t w = 0; w < o->n_sweep; w++) printf(" %9zu", o->sweep[w]);
  printf("  log-log slope\n");
  for (int k = 0; k < N_KINDS; k++)
    for (int j = 0; j < 3; j++) {
      double sx = 0, sy = 0, sxx = 0, sxy = 0;
      size_t n = 0;
      for (size_t w = 0; w < o->n_sweep; w++) {
        double v = kind_mean(&means[w], k, j);
        if (!isfinite(v)) continue;
        double x = log((double)o->sweep[w]), y = log(v);
        sx += x, sy += y, sxx += x * x, sxy += x * y, n++;
      }
      if (!n) continue; /* no layer of this kind, or a metric it does not have */
      printf("%-10s %-10s", stab_kind_name((stab_kind)k), metric[j]);
      for (size_t w = 0; w < o->n_sweep; w++) printf(" %9.4g", kind_mean(&means[w], k, j));
      double den = (double)n * sxx - sx * sx;
      if (n >= 2 && den > 0) printf("  %+.3f\n", ((double)n * sxy - sx * sy) / den);
      else printf("  -\n");
    }
}

/* The learning-rate sweep's table: the held-out loss of every run, a row per width and a column
 * per rate ("div@N": the loss turned non-finite at step N), and the rate of the lowest loss. */
static void print_lr_sweep(const options *o, const size_t *widths, size_t n_w, const run_result *res) {
  printf("learning-rate sweep (%s): held-out loss at the end, per width and peak learning rate\n%-7s",
         o->optimizer == OPTIM_ADAMW ? "adamw" : "steepest", "width");
  for (size_t l = 0; l < o->n_sweep_lr; l++) printf(" %9g", o->sweep_lr[l]);
  printf("  best lr\n");
  for (size_t w = 0; w < n_w; w++) {
    printf("%-7zu", widths[w]);
    size_t best = SIZE_MAX;
    for (size_t l = 0; l < o->n_sweep_lr; l++) {
      const run_result *r = &res[l * n_w + w];
      char cell[32];
      if (r->diverged) snprintf(cell, sizeof cell, "div@%zu", r->steps_done);
      else snprintf(cell, sizeof cell, "%.4f", r->heldout);
      printf(" %9s", cell);
      if (!r->diverged && isfinite(r->heldout) && (best == SIZE_MAX || r->heldout < res[best * n_w + w].heldout))
        best = l;
    }
    if (best == SIZE_MAX) printf("  -\n");
    else printf("  %g\n", o->sweep_lr[best]);
  }
}

/* One line of DIR/lr-sweep.csv, flushed, so that a sweep stopped part way keeps the runs done. */
static int csv_row(FILE *csv, const char *path, const options *o, size_t width, double lr, const run_result *r) {
  fprintf(csv, "%s,%zu,%g,%s,%zu,%.6g,%.6g,%.6g,%llu\n", o->optimizer == OPTIM_ADAMW ? "adamw" : "steepest", width,
          lr, r->diverged ? "diverged" : "ok", r->steps_done, r->final_loss, r->heldout, r->first_loss,
          (unsigned long long)o->seed);
  if (fflush(csv) || ferror(csv)) {
    cli_error("%s: cannot write: %s", path, strerror(errno));
    return 1;
  }
  return 0;
}

/* --sweep-widths and/or --sweep-lrs: one run per (learning rate, width), into DIR/lr-X/width-W/
 * (a level the sweep does not vary left out of the path). A run that diverges ends a width
 * sweep alone (its slopes need every width) but not a learning-rate sweep, where diverging is
 * one of the outcomes measured. Returns the exit status. */
static const char csv_header[] =
    "optimizer,width,lr,status,steps_done,final_train_loss,heldout_loss,initial_train_loss,seed\n";

/* The directory of the sweep's run at rate lr and width into dir; -1 when too long. */
static int sweep_dir(char *dir, size_t n, const options *o, double lr, size_t width) {
  int len = o->n_sweep_lr && o->n_sweep ? snprintf(dir, n, "%s/lr-%g/width-%zu", o->out, lr, width)
            : o->n_sweep_lr             ? snprintf(dir, n, "%s/lr-%g", o->out, lr)
                                        : snprintf(dir, n, "%s/width-%zu", o->out, width);
  return len < (int)n ? 0 : -1;
}

/* Before any run: every run's directory checked for an earlier run (check_earlier_run), and
 * DIR/lr-sweep.csv under the same rule: kept and appended to when its columns are this
 * program's (the rows of other runs, which the seed column tells apart), refused when they
 * are not, replaced with --replace. *append: 1 to append to it. Returns 0 or the exit status. */
static int sweep_check(const options *o, const char *csv_path, int *append) {
  size_t n_lr = o->n_sweep_lr ? o->n_sweep_lr : 1, n_w = o->n_sweep ? o->n_sweep : 1;
  char dir[4096];
  *append = 0;
  for (size_t l = 0; l < n_lr; l++)
    for (size_t w = 0; w < n_w; w++) {
      double lr = o->n_sweep_lr ? o->sweep_lr[l] : o->lr;
      if (sweep_dir(dir, sizeof dir, o, lr, o->n_sweep ? o->sweep[w] : o->width)) {
        cli_error("--out is too long");
        return CLI_USAGE;
      }
      int rc = check_earlier_run(dir, out_mode(o));
      if (rc) return rc;
    }
  if (!o->n_sweep_lr || stab_output_check(csv_path, out_mode(o), "the table of an earlier sweep") == STAB_OK) {
    struct stat sb;
    *append = o->n_sweep_lr && !o->replace && stat(csv_path, &sb) == 0;
    return 0;
  }
  /* there, and not to be replaced: appended to when it has this program's columns */
  char line[256] = "";
  FILE *f = fopen(csv_path, "r");
  if (f && fgets(line, sizeof line, f) && !strcmp(line, csv_header)) {
    fclose(f);
    *append = 1;
    return 0;
  }
  if (f) fclose(f);
  line[strcspn(line, "\n")] = 0;
  cli_error("%s: its columns are not this sweep's (%s%s%s): kept as it is; --replace replaces it, or give "
            "another --out", csv_path, f ? "header '" : "cannot read it: ", f ? line : strerror(errno), f ? "'" : "");
  return CLI_USAGE;
}

int sweep(const options *o, const data_set *data, train_world *dp) {
  size_t n_lr = o->n_sweep_lr ? o->n_sweep_lr : 1, n_w = o->n_sweep ? o->n_sweep : 1;
  const size_t *widths = o->n_sweep ? o->sweep : &o->width;
  kind_means *means = calloc(n_lr * n_w, sizeof *means);
  run_result *res = calloc(n_lr * n_w, sizeof *res);
  int writer = !dp || train_world_rank(dp) == 0, rc = 0;
  FILE *csv = NULL;
  char dir[4096], csv_path[4200];
  int append = 0;
  snprintf(csv_path, sizeof csv_path, "%s/lr-sweep.csv", o->out);
  if (!means || !res) {
    cli_error("out of memory");
    rc = 1;
  } else if (writer && !(rc = check_out(o->out, 0)) && !(rc = sweep_check(o, csv_path, &append)) && o->n_sweep_lr) {
    int no_dir = mkdirs(o->out);
    if (no_dir || !(csv = fopen(csv_path, append ? "a" : "w"))) {
      cli_error("%s: cannot create: %s", no_dir ? o->out : csv_path, strerror(errno));
      rc = 1;
    } else if (!append) {
      fputs(csv_header, csv);
    }
  }
  rc = together(dp, rc);
  for (size_t l = 0; l < n_lr && !rc; l++) {
    int all_ran = 1;
    for (size_t w = 0; w < n_w && !rc; w++) {
      options one = *o;
      one.width = widths[w];
      if (o->n_sweep && o->head_dim) one.heads = one.width / o->head_dim; /* a fixed head dimension */
      if (o->n_sweep_lr) one.lr = o->sweep_lr[l], one.lr_given = 1;
      if (sweep_dir(dir, sizeof dir, o, one.lr, one.width)) {
        cli_error("--out is too long");
        rc = 2;
        break;
      }
      one.out = dir;
      size_t at = l * n_w + w;
      if (o->n_sweep_lr) {
        cli_error("sweep: lr %g, width %zu (%zu of %zu) into %s", one.lr, one.width, at + 1, n_lr * n_w, dir);
        printf("== lr %g, width %zu: %s\n", one.lr, one.width, dir);
      } else {
        cli_error("sweep: width %zu (%zu of %zu) into %s", one.width, at + 1, n_w, dir);
        printf("== width %zu: %s\n", one.width, dir);
      }
      fflush(stdout);
      rc = train_run(&one, data, &means[at], &res[at], dp);
      if (rc == 1 && res[at].diverged && o->n_sweep_lr) rc = 0, all_ran = 0; /* an outcome, not a failure */
      if (!rc && csv && csv_row(csv, csv_path, o, one.width, one.lr, &res[at])) rc = 1;
      if (o->n_sweep_lr) rc = together(dp, rc);
    }
    if (!rc && o->n_sweep && all_ran) print_sweep(o, o->n_sweep_lr ? o->sweep_lr[l] : o->lr, &means[l * n_w]);
  }
  if (!rc && o->n_sweep_lr) {
    print_lr_sweep(o, widths, n_w, res);
    if (writer) printf("lr sweep: %s\n", csv_path);
  }
  if (csv && fclose(csv) && !rc) {
    cli_error("%s: cannot write: %s", csv_path, strerror(errno));
    rc = 1;
  }
  free(means);
  free(res);
  return rc;
}
