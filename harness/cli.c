/* cli.c — the command-line conventions of cli.h: one wording for every usage mistake, the same
 * program name in every message, the same parsers for option values in every program. */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stabmeter.h"

const char *cli_name = "stabmeter";

void cli_init(const char *installed_name) {
  cli_name = installed_name;
  opterr = 0;
}

static void try_help(void) { fprintf(stderr, "Try '%s --help' for more information.\n", cli_name); }

int cli_getopt_error(int c, char **argv) {
  /* getopt_long leaves the offending word at argv[optind - 1] for long options; for a short
   * option the word may hold several letters (-qx), so name the letter itself. */
  const char *word = optind > 0 ? argv[optind - 1] : "";
  int is_long = word && word[0] == '-' && word[1] == '-';
  if (c == ':') {
    if (is_long) {
      size_t n = strcspn(word, "=");
      fprintf(stderr, "%s: option '%.*s' needs a value\n", cli_name, (int)n, word);
    } else {
      fprintf(stderr, "%s: option '-%c' needs a value\n", cli_name, optopt);
    }
  } else if (is_long) {
    size_t n = strcspn(word, "=");
    if (word[n] == '=')
      fprintf(stderr, "%s: option '%.*s' takes no value (or is unknown)\n", cli_name, (int)n, word);
    else
      fprintf(stderr, "%s: unknown option '%s'\n", cli_name, word);
  } else if (optopt) {
    fprintf(stderr, "%s: unknown option '-%c'\n", cli_name, optopt);
  } else {
    fprintf(stderr, "%s: unknown option '%s'\n", cli_name, word);
  }
  try_help();
  return CLI_USAGE;
}

int cli_bad_value(const char *option, const char *value, const char *want) {
  if (want)
    fprintf(stderr, "%s: %s: bad value '%s' (want %s)\n", cli_name, option, value, want);
  else
    fprintf(stderr, "%s: %s: bad value '%s'\n", cli_name, option, value);
  try_help();
  return CLI_USAGE;
}

int cli_usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cli_verror(fmt, ap);
  va_end(ap);
  try_help();
  return CLI_USAGE;
}

void cli_verror(const char *fmt, va_list ap) {
  fprintf(stderr, "%s: ", cli_name);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
}

void cli_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cli_verror(fmt, ap);
  va_end(ap);
}

int cli_version(void) {
  printf("%s (stabmeter) %s\n", cli_name, stab_version());
  return CLI_OK;
}

int cli_whole(const char *option, const char *value, unsigned long long lo, unsigned long long hi,
              unsigned long long *out) {
  char want[96];
  snprintf(want, sizeof want, "a whole number in %llu..%llu", lo, hi);
  if (!value || !*value || strspn(value, "0123456789") != strlen(value))
    return cli_bad_value(option, value ? value : "", want);
  errno = 0;
  unsigned long long v = strtoull(value, NULL, 10);
  if (errno == ERANGE || v < lo || v > hi) return cli_bad_value(option, value, want);
  *out = v;
  return CLI_OK;
}

int cli_real(const char *option, const char *value, double lo, int lo_open, double hi, int hi_open,
             double *out) {
  char want[128];
  snprintf(want, sizeof want, "a number %s %g and %s %g", lo_open ? ">" : ">=", lo, hi_open ? "<" : "<=", hi);
  char *end;
  errno = 0;
  /* strtod skips leading blanks; a value is the number alone, as for cli_whole */
  double v = value && *value && !isspace((unsigned char)*value) ? strtod(value, &end) : NAN;
  if (!value || !*value || isnan(v) || *end || errno == ERANGE || !isfinite(v) || (lo_open ? v <= lo : v < lo) ||
      (hi_open ? v >= hi : v > hi))
    return cli_bad_value(option, value ? value : "", want);
  *out = v;
  return CLI_OK;
}

int cli_choice(const char *option, const char *value, const char *const *words, int *index) {
  for (int i = 0; words[i]; i++)
    if (!strcmp(value, words[i])) {
      *index = i;
      return CLI_OK;
    }
  char want[256] = "one of";
  size_t n = strlen(want);
  for (int i = 0; words[i] && n < sizeof want - 1; i++)
    n += (size_t)snprintf(want + n, sizeof want - n, "%s%s", i ? ", " : " ", words[i]);
  return cli_bad_value(option, value, want);
}
