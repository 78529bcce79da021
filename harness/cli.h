/* cli.h — the command-line conventions every stabmeter program follows, in one place.
 *
 * Every program: -h/--help and -V/--version; an unknown option, a missing argument or a bad
 * value is one line naming the option (and the value), then "Try 'stabmeter-X --help' for
 * more information.", exit 2; every message starts with the installed name ("stabmeter-X: ").
 * Exit codes: 0 success, 1 failure, 2 bad usage or bad input. */
#ifndef STAB_HARNESS_CLI_H
#define STAB_HARNESS_CLI_H

#include <stdarg.h>
#include <stdio.h>

/* Exit codes, as every --help and man page states them. */
enum { CLI_OK = 0, CLI_FAILED = 1, CLI_USAGE = 2 };

/* The installed name, e.g. "stabmeter-probe"; set once by cli_init, read by every message. */
extern const char *cli_name;

/* Sets cli_name (e.g. "stabmeter-probe") and makes getopt quiet, so that cli_getopt_error
 * speaks instead. Call first in main. */
void cli_init(const char *installed_name);

/* The short-option string every program passes to getopt_long: ':' (report a missing argument
 * apart from an unknown option), then "hV" and the program's own letters, e.g.
 * CLI_SHORTOPTS "o:" for -o FILE. */
#define CLI_SHORTOPTS ":hV"

/* What getopt_long returned '?' or ':' for, as one line plus the "Try" line on stderr.
 * argv as given to getopt_long. Returns CLI_USAGE. */
int cli_getopt_error(int c, char **argv);

/* "stabmeter-X: OPTION: bad value 'VALUE' (WANT)" plus the "Try" line; want may be NULL
 * ("want" says what would be accepted: "a whole number in 1..8192"). Returns CLI_USAGE. */
int cli_bad_value(const char *option, const char *value, const char *want);

/* Any other usage mistake: "stabmeter-X: <message>" plus the "Try" line. Returns CLI_USAGE. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "stabmeter-X: <message>" on stderr (no "Try" line): a failure or bad input found while
 * running. The caller picks the exit code. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_verror(const char *fmt, va_list ap);

/* "stabmeter-X (stabmeter) VERSION" on stdout, for --version. Returns CLI_OK. */
int cli_version(void);

/* Parsers for option values: 0 and the value, or cli_bad_value's message and CLI_USAGE.
 * A whole number is decimal digits only (no sign, no suffix, no spaces) in [lo, hi]. */
int cli_whole(const char *option, const char *value, unsigned long long lo, unsigned long long hi,
              unsigned long long *out);
/* A finite real number in [lo, hi] (either bound may be excluded: lo_open, hi_open). */
int cli_real(const char *option, const char *value, double lo, int lo_open, double hi, int hi_open,
             double *out);
/* One of a NULL-terminated list of words; *index receives its position. */
int cli_choice(const char *option, const char *value, const char *const *words, int *index);

#endif
