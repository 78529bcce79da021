#!/bin/sh
# headers.sh — the public headers as a user's compiler sees them: the umbrella <stabmeter.h> and
# each <stabmeter/NAME.h> compiles alone in a translation unit of its own (it includes what it
# needs), twice over (its include guard), as strict C99; the umbrella includes every one of them;
# and from C++ (g++, when present) each compiles too and the library's functions keep C linkage.
set -u
srcdir=${srcdir:-.}
inc=$srcdir/include
cc=${CC:-cc}
cxx=${CXX:-g++}
fail() { echo "FAIL: $*"; exit 1; }
command -v "$cc" >/dev/null 2>&1 || { echo "SKIP: $cc not found"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/headers.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

cflags="-std=c99 -pedantic -Wall -Wextra -Werror -Wstrict-prototypes"
subs=$(cd "$inc" && ls stabmeter/*.h) || fail "no headers under $inc/stabmeter"
[ "$(echo "$subs" | wc -l)" -ge 11 ] || fail "only $(echo "$subs" | wc -l) headers under $inc/stabmeter"
n=0
for h in stabmeter.h $subs; do
  printf '#include <%s>\n#include <%s>\n' "$h" "$h" >"$tmp/one.c"
  # shellcheck disable=SC2086
  "$cc" $cflags -I"$inc" -c "$tmp/one.c" -o "$tmp/one.o" 2>"$tmp/cc.log" ||
    { cat "$tmp/cc.log"; fail "<$h> does not compile alone ($cc $cflags)"; }
  n=$((n + 1))
done
echo "C: $n headers compile alone, each included twice ($cc $cflags)"
# The MPI layer's header, over the umbrella, with the MPI compiler when there is one.
if command -v mpicc >/dev/null 2>&1; then
  printf '#include <stabmeter_mpi.h>\n#include <stabmeter_mpi.h>\n' >"$tmp/mpi.c"
  # shellcheck disable=SC2086
  mpicc $cflags -I"$inc" -c "$tmp/mpi.c" -o "$tmp/mpi.o" 2>"$tmp/cc.log" ||
    { cat "$tmp/cc.log"; fail "<stabmeter_mpi.h> does not compile alone (mpicc $cflags)"; }
  echo "C: <stabmeter_mpi.h> compiles alone (mpicc)"
else
  echo "SKIP (stabmeter_mpi.h): mpicc not found"
fi

# The umbrella is what programs written against one header include: it must bring every concern.
for h in $subs; do
  grep -q "^#include \"$h\"" "$inc/stabmeter.h" || fail "stabmeter.h does not include $h"
done
echo "stabmeter.h includes all $(echo "$subs" | wc -w) sub-headers"

if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "SKIP (C++ part): $cxx not found"
  exit 0
fi
cxxflags="-std=c++11 -pedantic -Wall -Wextra -Werror"
for h in stabmeter.h $subs; do
  printf '#include <%s>\n' "$h" >"$tmp/one.cc"
  # shellcheck disable=SC2086
  "$cxx" $cxxflags -I"$inc" -c "$tmp/one.cc" -o "$tmp/one.o" 2>"$tmp/cxx.log" ||
    { cat "$tmp/cxx.log"; fail "<$h> does not compile alone as C++ ($cxx $cxxflags)"; }
done
echo "C++: every header compiles alone ($cxx $cxxflags)"

# One function of each header taken from C++: the object must ask for the plain C names (a header
# whose extern "C" were missing would ask for mangled ones, which the library does not export).
cat >"$tmp/calls.cc" <<'EOF'
#include <stabmeter.h>
typedef void (*fn)();
int main() {
  const fn fns[] = {
    reinterpret_cast<fn>(&stab_version),        /* stabmeter.h */
    reinterpret_cast<fn>(&stab_strerror),       /* status.h */
    reinterpret_cast<fn>(&stab_layer_metrics),  /* layer.h */
    reinterpret_cast<fn>(&stab_monitor_create), /* monitor.h */
    reinterpret_cast<fn>(&stab_trace_open),     /* trace.h */
    reinterpret_cast<fn>(&stab_trace_read_open), /* trace_read.h */
    reinterpret_cast<fn>(&stab_ckpt_read_f32),  /* checkpoint.h */
    reinterpret_cast<fn>(&stab_probe_open),     /* probe.h */
    reinterpret_cast<fn>(&stab_model_describe), /* model.h */
    reinterpret_cast<fn>(&stab_gguf_open),      /* formats.h */
    reinterpret_cast<fn>(&stab_spectral_norm),  /* spectral.h */
    reinterpret_cast<fn>(&stab_msign),          /* steepest.h */
    reinterpret_cast<fn>(&stab_output_check),   /* files.h */
  };
  return fns[0] == nullptr;
}
EOF
# shellcheck disable=SC2086
"$cxx" $cxxflags -I"$inc" -c "$tmp/calls.cc" -o "$tmp/calls.o" 2>"$tmp/cxx.log" ||
  { cat "$tmp/cxx.log"; fail "a C++ program taking one function of each header does not compile"; }
if ! command -v nm >/dev/null 2>&1; then
  echo "SKIP (C linkage): nm not found"
  exit 0
fi
nm -u "$tmp/calls.o" | awk '{ print $NF }' >"$tmp/undefined"
for f in stab_version stab_strerror stab_layer_metrics stab_monitor_create stab_trace_open stab_trace_read_open \
  stab_ckpt_read_f32 stab_probe_open stab_model_describe stab_gguf_open stab_spectral_norm stab_msign stab_output_check; do
  grep -qx "$f" "$tmp/undefined" || { cat "$tmp/undefined"; fail "C++ asks for $f by another name (no extern \"C\"?)"; }
done
echo "C++: the functions keep their C names"
