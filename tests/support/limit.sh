# limit.sh — sourced by the hostile-input tests: runs a program under a time limit so that a
# hang fails the test instead of stalling make check, and checks its exit code and message.
#
# The limit only catches programs that block forever (a FIFO with no writer, a read retried
# without end). It is far above what any case needs even under the sanitizer build on a busy
# machine, so no test depends on how fast the machine is: a case that takes 1 s normally gets
# LIMIT_SECONDS (default 600) before it counts as hung.
#
# Provides, after `. "$src/tests/support/limit.sh"`:
#   limited CMD...           runs CMD with stdin from /dev/null, stdout to $out_file and stderr
#                            to $err_file (in $dir, which the caller creates), kills it (and what
#                            it started) after LIMIT_SECONDS; sets $rc (124 = hung)
#   expect WHAT CODE PATTERN CMD...
#                            runs CMD under the limit and passes when it exits CODE and its
#                            standard error matches the extended regex PATTERN ('' = anything);
#                            else prints FAIL with WHAT, what happened and the message
#   pass / fail WHAT         count a check ($checks, $fails)
#   summary NAME             the closing line; its status is the test's exit status
# The caller sets dir (a scratch directory) before calling them.

LIMIT_SECONDS=${LIMIT_SECONDS:-600}
checks=${checks:-0}
fails=${fails:-0}

pass() { checks=$((checks + 1)); }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); checks=$((checks + 1)); }

limited() {
  out_file=$dir/limited.out
  err_file=$dir/limited.err
  # --kill-after: a program that ignores SIGTERM while blocked still goes.
  timeout --kill-after=10 "$LIMIT_SECONDS" "$@" </dev/null >"$out_file" 2>"$err_file"
  rc=$?
}

expect() {
  what=$1 code=$2 pattern=$3
  shift 3
  limited "$@"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    fail "$what: still running after ${LIMIT_SECONDS} s (hung): $*"
  elif [ "$rc" -ne "$code" ]; then
    fail "$what: exit $rc, want $code: $*"
    sed 's/^/    /' "$err_file" | head -n 5
  elif [ -n "$pattern" ] && ! grep -Eq -- "$pattern" "$err_file"; then
    fail "$what: message does not match /$pattern/:"
    sed 's/^/    /' "$err_file" | head -n 5
  else
    pass
  fi
}

# The closing line, in Check's format so that quickstart.sh counts these checks with the
# C tests'; returns the test's exit status (0 when nothing failed).
summary() {
  echo "$1: $checks checks, $fails failures"
  echo "$(( checks ? 100 * (checks - fails) / checks : 100 ))%: Checks: $checks, Failures: $fails, Errors: 0"
  [ "$fails" -eq 0 ]
}
