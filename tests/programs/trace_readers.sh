#!/bin/sh
# trace_readers.sh — the trace as the tools people plot with read it: xarray with the h5netcdf
# and the netcdf4 engines, h5py and ncdump, on a fresh trace from harness/train, on one it
# appended to (--resume), on one still being written and then killed (read through SWMR, then
# after h5clear -s), and on format_version 1 and 3 traces written by older stabmeters (main at
# 04264e9 and 09c36c8, tests/corpus/trace-v1 and trace-v3), which must still read and export as
# before and become version 4 when appended to (rewritten in the (step, layer) layout, its ratios filled in from its rows). Each reader that is not installed is skipped (Debian:
# python3-xarray python3-h5netcdf python3-netcdf4 netcdf-bin; quickstart.sh installs them);
# exit 77 when none is.
set -u
# The readers are Python and ncdump, never instrumented: the sanitizer build (STAB_SANITIZED)
# would rerun the same reads of the same files, with only harness/train slower (78 s against
# 12 s). The writer runs instrumented in tests/programs/train.sh, check_trace and hostile_writers.sh.
if [ -n "${STAB_SANITIZED:-}" ]; then
  echo "SKIP: the readers run in the plain build (STAB_SANITIZED is set)"
  exit 77
fi
src=${srcdir:-.}
build=${builddir:-.}
dir=$(mktemp -d "${TMPDIR:-/tmp}/trace_readers.XXXXXX") || exit 1
writer=
trap '[ -n "$writer" ] && kill -KILL $writer 2>/dev/null; rm -rf "$dir"' EXIT
. "$src/tests/support/limit.sh"

. "$src/tests/python/python_pick.sh"
py=$(pick_python h5py numpy)
engines=
if [ -n "$py" ]; then
  "$py" -c 'import xarray, h5netcdf' 2>/dev/null && engines="$engines h5netcdf"
  "$py" -c 'import xarray, netCDF4' 2>/dev/null && engines="$engines netcdf4"
fi
have_ncdump=0
command -v ncdump >/dev/null 2>&1 && have_ncdump=1
if [ -z "$py" ] && [ $have_ncdump -eq 0 ]; then
  echo "SKIP: neither h5py nor ncdump (Debian: python3-h5py python3-xarray python3-h5netcdf python3-netcdf4 netcdf-bin)"
  exit 77
fi
[ -n "$py" ] || echo "SKIP (part): no python3 with h5py: the h5py and xarray checks"
[ -n "$py" ] && [ -z "$engines" ] && echo "SKIP (part): xarray with h5netcdf or netCDF4 is not importable"
[ $have_ncdump -eq 1 ] || echo "SKIP (part): no ncdump (Debian: netcdf-bin)"

# The checks of one trace by every installed Python reader: h5py sees the attributes, each
# xarray engine opens the root, /scalars and /layers with step (and layer, head) as the
# coordinates: each metric a 2-D variable (step, layer), with the values h5py reads, units (or
# units_<kind> where kinds differ) and long_name on each; param_count_unique sums to the
# model's own parameter count when the run_config gives one.
cat >"$dir/readers.py" <<'PY'
import json, sys, warnings
import h5py, numpy as np
path, engines, plain = sys.argv[1], sys.argv[2].split(), sys.argv[3] == "plain"
bad = []
def check(cond, what):
    if not cond:
        bad.append(what)
def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)

f = h5py.File(path, "r", swmr=True)
check(f.attrs["format_version"] == 4, "format_version %r" % f.attrs["format_version"])
groups = ["scalars", "layers"]
want = {}  # group -> {variable: values}
def visit(name, obj):
    if isinstance(obj, h5py.Dataset):
        check("long_name" in obj.attrs and text(obj.attrs["long_name"]), "h5py: %s has no long_name" % name)
        if obj.dtype.kind == "f" or name.endswith("step"):
            check(any(a == "units" or a.startswith("units_") for a in obj.attrs), "h5py: %s has no units" % name)
f.visititems(visit)
check(f["step"].attrs.get("CLASS") == b"DIMENSION_SCALE", "/step is not a dimension scale")
L = f["layers"]
layers = [text(n) for n in L["layer"][:]]
check(L["layer"].attrs.get("CLASS") == b"DIMENSION_SCALE", "/layers/layer is not a dimension scale")
check(all(text(d) for d in L["description"][:]), "a layer has no description")
unique = int(L["param_count_unique"][:].sum())
for w in L["shares_storage_with"][:]:
    for other in text(w).split():
        check(other in layers, "shares storage with a layer that is not there: %r" % other)
for g in groups:
    grp = f[g]
    check("step" in grp and list(grp["step"][:]) == list(f["step"][:]), "%s has no copy of /step" % g)
    want[g] = {k: d[:] for k, d in grp.items() if k not in ("step", "layer", "head")}
config = json.loads(text(f.attrs["run_config"]))
params = config.get("model", {}).get("parameters") if isinstance(config.get("model"), dict) else None
if params is not None:
    check(unique == params, "param_count_unique sums to %d, the model has %d parameters" % (unique, params))
steps = f["step"][:]
f.close()

import xarray as xr
import h5netcdf
def open_ds(engine, group):
    if plain:
        return xr.open_dataset(path, engine=engine, group=group)
    # a trace still being written, or killed: only an SWMR open reads it (h5netcdf passes swmr to h5py)
    return xr.open_dataset(xr.backends.H5NetCDFStore(h5netcdf.File(path, "r", swmr=True), group=group))
for engine in engines:
    if not plain and engine != "h5netcdf":
        continue  # netCDF-C has no SWMR read
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        root = open_ds(engine, None)
    check("step" in root.coords and list(root["step"].values) == list(steps), "%s: root: step is not the coordinate" % engine)
    check(root["wall_time"].dims == ("step",) and root["wall_time"].attrs.get("units") == "s",
          "%s: root: wall_time %s %s" % (engine, root["wall_time"].dims, root["wall_time"].attrs))
    root.close()
    for g in groups:
        ds = open_ds(engine, g)
        where = "%s: %s" % (engine, g)
        check("step" in ds.coords, "%s: step is not a coordinate (coords %s)" % (where, list(ds.coords)))
        check(list(ds["step"].values) == list(steps), "%s: step values" % where)
        check(set(ds.data_vars) == set(want[g]), "%s: variables %s, h5py %s" % (where, sorted(ds.data_vars), sorted(want[g])))
        if g == "layers":
            check([text(x) for x in ds["layer"].values] == layers, "%s: layer is not the coordinate of the layers' names" % where)
        for k, v in ds.data_vars.items():
            rows = v.dims[:1] == ("step",)
            expected = ("step",) if g == "scalars" else ("step", "head") if k == "head_bound" else \
                       ("head",) if k == "head_layer" else ("step", "layer") if rows else ("layer",)
            check(v.dims == expected, "%s/%s: dims %s, expected %s" % (where, k, v.dims, expected))
            check("long_name" in v.attrs, "%s/%s: attrs %s" % (where, k, v.attrs))
            if rows:
                check(any(a == "units" or a.startswith("units_") for a in v.attrs), "%s/%s: no units %s" % (where, k, v.attrs))
            if k in want[g] and rows:
                check(np.array_equal(v.values, want[g][k], equal_nan=True), "%s/%s: values differ from h5py's" % (where, k))
        ds.close()
if bad:
    sys.exit("FAIL %s:\n  " % path + "\n  ".join(bad[:20]))
print("%s: h5py%s: %d groups, step the coordinate of each" % (path, "".join(" xarray/" + e for e in engines), len(groups)))
PY

# read_all WHAT TRACE: every installed reader on a trace that is closed (plain opens work)
read_all() {
  if [ -n "$py" ]; then
    expect "$1: h5py and xarray" 0 '' "$py" "$dir/readers.py" "$2" "$engines" plain
    [ "$rc" -eq 0 ] || sed 's/^/    /' "$out_file" "$err_file" | head -n 25
  fi
  if [ $have_ncdump -eq 1 ]; then
    expect "$1: ncdump -h" 0 '' ncdump -h "$2"
    if [ "$rc" -eq 0 ]; then
      grep -q 'step = UNLIMITED' "$out_file" || fail "$1: ncdump names no step dimension"
      grep -q 'phony_dim' "$out_file" && fail "$1: ncdump makes up dimensions: $(grep -m1 phony_dim "$out_file")"
      grep -q 'forward(step, layer)' "$out_file" || fail "$1: ncdump: no forward(step, layer) variable"
    fi
  fi
}

train=$build/harness/train
small="--width 32 --depth 1 --steps 8 --batch 4 --context 16"

# 1. a fresh trace
expect "train a small model" 0 '' $train $small --checkpoint-every 4 --out "$dir/run"
read_all "fresh trace" "$dir/run/trace.h5"

# 2. appended to: resumed at step 4, the rows after it replaced
expect "resume at step 4" 0 '' $train $small --steps 10 --resume "$dir/run/step-000004.safetensors" --out "$dir/run"
read_all "resumed trace" "$dir/run/trace.h5"
if [ -n "$py" ]; then
  expect "resumed trace: steps" 0 '' "$py" -c 'import h5py, sys; s = list(h5py.File(sys.argv[1], "r")["step"][:]); sys.exit(0 if s == list(range(1, 11)) else "steps %s" % s)' "$dir/run/trace.h5"
fi

# 2b. written by rank 0 of a data-parallel run (configure --with-mpi): the same readers, unchanged.
# Under the sanitizers every malloc is unwound in full, as in tests/programs/mpi.sh, for Open MPI's leaks
# at exit to be matched in lsan.supp (ASAN_OPTIONS is ignored by a build without them).
if [ -n "${MPIRUN:-}" ]; then
  expect "train --data-parallel on 2 ranks" 0 '' env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0" \
    "$MPIRUN" -np 2 --oversubscribe $train $small --data-parallel --out "$dir/dp"
  read_all "data-parallel trace" "$dir/dp/trace.h5"
fi

# 3. a trace being written (the writer stopped with SIGSTOP mid-run, its lock held and SWMR on),
# then killed: read through SWMR with the step coordinate; after h5clear -s by everything.
if [ -n "$py" ]; then
  live=$dir/live.h5
  "$build/tests/support/trace_writer" --steps 100000 --delay-ms 5 "$live" >/dev/null 2>&1 &
  writer=$!
  expect "a running writer's trace has rows" 0 '' "$py" -c '
import os, sys, time, h5py
while True:  # until the first flushed rows, as long as the writer runs
    try:
        with h5py.File(sys.argv[1], "r", swmr=True) as f:
            if f["step"].shape[0] >= 3:
                sys.exit(0)
    except (OSError, KeyError):
        pass
    try:
        os.kill(int(sys.argv[2]), 0)
    except OSError:
        sys.exit("the writer ended before its trace had 3 rows")
    time.sleep(0.01)' "$live" $writer
  # Stopped in the middle of a flush, the writer leaves some datasets a row longer than others
  # (SWMR orders one dataset's metadata, not several datasets'); xarray then pads the shorter
  # ones, the group's step included, to the longest with fill values, and the checks of step's
  # values fail: they are tried again between flushes. (Rows up to the length of /step are
  # complete, always.) What was read while stopped is what the file holds once killed.
  kill -STOP $writer
  if echo "$engines" | grep -q h5netcdf; then
    tries=0
    while :; do
      limited "$py" "$dir/readers.py" "$live" "$engines" swmr
      tries=$((tries + 1))
      [ "$rc" -eq 0 ] || [ $tries -ge 20 ] && break
      kill -CONT $writer
      sleep 0.1
      kill -STOP $writer
    done
    if [ "$rc" -eq 0 ]; then pass; else
      fail "running writer's trace: xarray/h5netcdf through SWMR, $tries tries"
      sed 's/^/    /' "$out_file" "$err_file" | head -n 25
    fi
  fi
  kill -KILL $writer
  kill -CONT $writer 2>/dev/null
  wait $writer 2>/dev/null
  writer=
  if echo "$engines" | grep -q h5netcdf; then
    expect "killed writer's trace: xarray/h5netcdf through SWMR" 0 '' "$py" "$dir/readers.py" "$live" "$engines" swmr
  fi
  expect "killed writer's trace: stabmeter-export reads it as is" 0 '' "$build/harness/export" "$live"
  if command -v h5clear >/dev/null 2>&1; then
    expect "h5clear -s" 0 '' h5clear -s "$live"
    read_all "killed trace after h5clear -s" "$live"
  fi
fi

# 4. format_version 1 (main at 04264e9, before version 2) and 3 (main at 09c36c8, the last of
# the group-per-layer layout): h5py, export and the notebooks' reader read them as before;
# appended to, each becomes version 4 with its rows kept and their ratios.
for old in 1:trace-v1/trace_writer-main-04264e9.h5.gz 3:trace-v3/trace_writer-main-09c36c8.h5.gz; do
v=${old%%:*}
vf=$dir/v$v.h5
gzip -dc "$src/tests/corpus/${old#*:}" >"$vf" || fail "cannot unpack the v$v trace"
expect "v$v trace: stabmeter-export" 0 '' "$build/harness/export" "$vf"
cp "$out_file" "$dir/v$v.csv"
if [ -n "$py" ]; then
  cat >"$dir/old.py" <<'PY'
import csv, math, sys
import h5py
path, exported, nb, version = sys.argv[1:5]
f = h5py.File(path, "r")
assert f.attrs["format_version"] == int(version), f.attrs["format_version"]
steps = list(f["step"][:])
assert steps == list(range(6)), steps
rows = list(csv.DictReader(open(exported)))
got = {(int(r["step"]), r["layer"], r["metric"]): float(r["value"]) for r in rows}
n = 0
for g in f["layers"]:
    for k, d in f["layers"][g].items():
        if k == "step":  # format 2 on: the group's copy of /step, no metric
            continue
        for i, s in enumerate(steps):
            v, e = d[i], got.get((s, g, k))
            assert e is not None, (g, k, s)
            assert (math.isnan(v) and math.isnan(e)) or v == e, (g, k, s, v, e)
            n += 1
sys.path.insert(0, nb)
import stabtrace
t = stabtrace.read_trace(path)
assert len(t.layers) == len(f["layers"]) and "step" not in t.scalars, (len(t.layers), list(t.scalars))
print("v%s: %d values exported as h5py reads them; stabtrace reads %d layers" % (version, n, len(t.layers)))
PY
  expect "v$v trace: h5py, and export's CSV holds its values" 0 '' "$py" "$dir/old.py" "$vf" "$dir/v$v.csv" "$src/notebooks-export" "$v"
  [ "$rc" -eq 0 ] || sed 's/^/    /' "$err_file" | tail -n 5
fi
cp "$vf" "$dir/v$v-appended.h5"
expect "v$v trace: appended to" 0 '' "$build/tests/support/trace_writer" --append --first-step 6 --steps 3 "$dir/v$v-appended.h5"
read_all "v$v trace appended to (now version 4)" "$dir/v$v-appended.h5"
if [ -n "$py" ]; then
  expect "v$v trace appended to: the old rows kept" 0 '' "$py" -c '
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
assert list(b["step"][:]) == list(range(9)), list(b["step"][:])
assert b.attrs["format_version"] == 4 and b.attrs["run_config"] == a.attrs["run_config"]
L = b["layers"]
names = [n.decode() for n in L["layer"][:]]
heads = [(n.decode(), int(h)) for n, h in zip(L["head_layer"][:], L["head"][:])]
for g in a["layers"]:
    i = names.index(g)
    for k, d in a["layers"][g].items():
        if k == "step":
            continue
        if k.startswith("head") and k.endswith("_bound"):
            got = L["head_bound"][:6, heads.index((g, int(k[4:-6])))]
        else:
            got = L[k][:6, i]
        assert np.array_equal(d[:], got, equal_nan=True), (g, k)
    for m in ("forward", "dependency", "update"):  # over the first finite value > 0 of the old rows
        v = a["layers"][g][m][:]
        ok = v[np.isfinite(v) & (v > 0)]
        want = v / ok[0] if len(ok) else np.full(len(v), np.nan)
        assert np.array_equal(L[m + "_ratio"][:6, i], want, equal_nan=True), (g, m)' "$vf" "$dir/v$v-appended.h5"
fi
done
summary trace_readers
