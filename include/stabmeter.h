/* stabmeter.h — per-layer stability metrics of neural-network weights.
 *
 * The three metrics of every layer (forward, dependency and update stability, each
 * defined in docs/manual/metrics.md, installed as $(docdir)/metrics.md) computed from f32 weights
 * in memory: pure functions for one layer,
 * and a monitor that a trainer creates once, registers its layers with, and asks for
 * the metrics every step without any allocation. Around them: the trace, an HDF5 file of every
 * step a monitor measured; readers of checkpoints (safetensors, Hugging Face models, GGUF,
 * llm.c) with the rules that make layers of a model's tensors; and the probe, which measures
 * every layer of a checkpoint.
 *
 * This header is the umbrella: the version, then one header per concern under stabmeter/, each
 * compiling on its own and including what it needs. Include this one (as every program written
 * against 0.8 and before does), or only those you use (<stabmeter/monitor.h>).
 *
 * Conventions used throughout:
 *  - Math is y = x W + b with W in R^{d_in x d_out}. In memory W is either out-major,
 *    [d_out][d_in] row-major (PyTorch nn.Linear, llm.c, GGUF), or in-major, [d_in][d_out].
 *  - Every function that can fail returns a stab_status (STAB_OK = 0, errors negative);
 *    results come back through output pointers. The library never prints, never exits,
 *    never aborts; a failure's detail is in stab_last_error() of the calling thread.
 *  - Weights are f32 (stab_layer_metrics also reads F16 and BF16 as stored: stab_layer.dtype);
 *    every sum accumulates in f64. Results do not depend on the number of threads.
 *  - A metric that does not exist for a kind, or is not yet measured, is NaN.
 */
#ifndef STABMETER_H
#define STABMETER_H

#define STAB_VERSION_MAJOR 0
#define STAB_VERSION_MINOR 13
#define STAB_VERSION_PATCH 0
#define STAB_VERSION_STRING "0.13.0"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the library actually linked, "MAJOR.MINOR.PATCH". */
const char *stab_version(void);

#ifdef __cplusplus
}
#endif

/* The headers in reading order. A trainer reads the first four; a program that probes a
 * checkpoint, checkpoint.h and probe.h; the others are for callers who go deeper. */
#include "stabmeter/status.h"     /* stab_status, stab_last_error, the message sink, the UTF-8 test */
#include "stabmeter/layer.h"      /* stab_layer (kinds, layouts, dtypes); one layer's metrics, whole or split */
#include "stabmeter/monitor.h"    /* the per-step monitor: create once, register layers, measure each step */
#include "stabmeter/trace.h"      /* every measured step of a monitor in an HDF5 file: the schema, writing */
#include "stabmeter/trace_read.h" /* a trace read back: steps, scalars, layers, each metric a column */
#include "stabmeter/checkpoint.h" /* any checkpoint opened whole (stab_checkpoint); a tensor, read as f32; what a file is */
#include "stabmeter/probe.h"      /* a checkpoint's every layer measured, and the report */
#include "stabmeter/model.h"      /* the kind rules: which layers a model's tensors make; GGUF <-> HF names */
#include "stabmeter/formats.h"    /* the readers: safetensors, sharded HF models, config.json, llm.c, GGUF */
#include "stabmeter/spectral.h"   /* the spectral engine: sigma of a matrix, its workspace, sharded sigma */
#include "stabmeter/steepest.h"   /* steepest descent per kind: init scale, msign, row normalisation, sign */
#include "stabmeter/files.h"      /* how inputs are opened, what outputs may replace (stab_output_check) */

#endif /* STABMETER_H */
