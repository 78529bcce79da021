#!/bin/sh
# bench_json.sh — harness/bench --json on one tiny :spiked size: the
# keys the issue-13 check reads are there, issue 32's targets with their bounds, the FMA rate and
# the arithmetic ceiling it gives, and the ARPACK (ladder and own-rule) and oracle-power ones are numbers
# when configure found ARPACK (config.h's HAVE_ARPACK), null (and said why) when it did not.
set -u
build=${builddir:-.}
out=$(mktemp "${TMPDIR:-/tmp}/stab-bench.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT
if ! "$build/harness/bench" --sizes 48x48:spiked --json --repeats 1 --cold-repeats 1 \
    >"$out" 2>/dev/null; then
  echo "FAIL: harness/bench --json exited non-zero"
  exit 1
fi
with_arpack=0
grep -q '^#define HAVE_ARPACK 1' "$build/config.h" 2>/dev/null && with_arpack=1
python3 - "$out" "$with_arpack" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
with_arpack = sys.argv[2] == "1"
bad = []
if doc["targets"]["arpack_available"] != with_arpack:
    bad.append("targets.arpack_available is %r, config.h says %r" % (doc["targets"]["arpack_available"], with_arpack))
keys = ["arpack_s", "arpack_rel_err", "arpack_tol", "arpack_reads", "speedup_vs_arpack",
        "krylov_tol_for_equal_error", "power_oracle_s", "power_oracle_iterations",
        "arpack_own_rule_s", "arpack_own_rule_tol", "arpack_own_rule_reads", "arpack_own_rule_rel_err",
        "speedup_vs_arpack_own_rule"]
for size in doc["sizes"]:
    name = "%dx%d%s" % (size["rows"], size["cols"], ":spiked" if size["spiked"] else "")
    for k in keys:
        if k not in size:
            bad.append("%s: no key %s" % (name, k))
        elif with_arpack and not isinstance(size[k], (int, float)):
            bad.append("%s: %s is %r, built with ARPACK" % (name, k, size[k]))
        elif not with_arpack and k.startswith("arpack") and size[k] is not None:
            bad.append("%s: %s is %r without ARPACK" % (name, k, size[k]))
    if with_arpack and isinstance(size.get("arpack_rel_err"), float) and size["arpack_rel_err"] > doc["tol"]:
        bad.append("%s: ARPACK's chosen answer has error %g > tol" % (name, size["arpack_rel_err"]))
    if with_arpack and isinstance(size.get("krylov_equal_error_rel_err"), float) and \
            size["krylov_equal_error_rel_err"] > size["arpack_rel_err"]:
        bad.append("%s: the library's compared answer is less accurate than ARPACK's" % name)
    # ARPACK by its own rule: at twice tol (its residual <= tol_a sigma^2 is the library's
    # r / (2 sigma^2) <= tol), against the library's own cold run at tol
    if with_arpack and isinstance(size.get("arpack_own_rule_tol"), float):
        if abs(size["arpack_own_rule_tol"] - 2 * doc["tol"]) > 1e-12 * doc["tol"]:
            bad.append("%s: arpack_own_rule_tol %g is not 2 tol" % (name, size["arpack_own_rule_tol"]))
        want = size["arpack_own_rule_s"] / size["cold_krylov_s"]
        if abs(size["speedup_vs_arpack_own_rule"] - want) > 1e-6 * want:
            bad.append("%s: speedup_vs_arpack_own_rule %g, not arpack_own_rule_s / cold_krylov_s = %g"
                       % (name, size["speedup_vs_arpack_own_rule"], want))
# issue 32's targets, each with its bound (no size here is one of theirs: values null)
bounds = {"pass_reference_fraction": ("min", 0.85), "pass_bf16_reference_fraction": ("min", 0.85),
          "pass_in_cache_sgemv_fraction": ("min", 0.60), "cold_4096_speedup": ("min", 100),
          "loaded_blas_slowdown": ("max", 1.3), "loaded_spin_slowdown": ("max", 2.2),
          "cold_vs_arpack_4096x4096": ("min", 1.5), "cold_vs_arpack_768x3072": ("min", 1.5),
          "cold_vs_arpack_3072x768": ("min", 1.5)}
for name, (side, bound) in bounds.items():
    t = doc["targets"].get(name)
    if not isinstance(t, dict):
        bad.append("targets.%s missing" % name)
    elif t.get(side) != bound or "pass" not in t:
        bad.append("targets.%s is %r, want %s %g" % (name, t, side, bound))
for size in ("4096x4096", "768x3072", "3072x768"):
    if doc["targets"]["cold_vs_arpack_" + size].get("rule") != "own":
        bad.append("targets.cold_vs_arpack_%s is not by ARPACK's own rule" % size)
for size in doc["sizes"]:
    if "pass1_GBps" not in size:
        bad.append("%dx%d: no key pass1_GBps (a pass of one vector)" % (size["rows"], size["cols"]))
# the arithmetic ceiling: the FMA rate (a number wherever a SIMD kernel runs) and the
# four-vector pass's 8 FMAs an element of 4 bytes at that rate; the targets carry it
rate = doc.get("fma_rate", "missing")
if doc["kernel"] in ("avx2", "avx512") and not (isinstance(rate, float) and rate > 1e9):
    bad.append("fma_rate is %r with the %s kernel" % (rate, doc["kernel"]))
c = doc.get("pass4_ceiling_GBps", "missing")
if isinstance(rate, float) and not (isinstance(c, float) and abs(c - rate / 8 * 4e-9) <= 1e-6 * c):
    bad.append("pass4_ceiling_GBps %r, not fma_rate / 8 x 4 bytes" % (c,))
for name in ("pass_in_cache_sgemv_fraction", "pass_reference_fraction", "pass_bf16_reference_fraction"):
    if "arithmetic_ceiling" not in doc["targets"].get(name, {}):
        bad.append("targets.%s has no arithmetic_ceiling" % name)
if not any(s["spiked"] for s in doc["sizes"]):
    bad.append("no spiked size in the output")
for b in bad:
    print("FAIL:", b)
if not bad:
    print("PASS: bench JSON keys (ARPACK %s)" % ("linked" if with_arpack else "absent"))
sys.exit(1 if bad else 0)
PY
