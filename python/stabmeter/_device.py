"""sigma(A), or sigma(A - B), of a torch tensor on its own device: the C engine's estimate
(lib/engine/spectral.c, stab_spectral_norm with the Lanczos method) written in torch operations,
so that a model on a GPU is measured where it is and the code the GPU runs is the code the tests
run on the CPU.

The same method, step for step: block Lanczos on G = A^T A with blocks of 4 vectors (from a warm
start the previous top right singular vector and the cold start's vectors 1 .. 3), full
reorthogonalisation (classical Gram-Schmidt, twice), an explicit restart from the leading Ritz
vectors when the basis (krylov_dim vectors, whole blocks) is full, the C engine's cold-start
vectors (the same seeds, the same numbers), and its error: the residual bound r / (2 theta) of
the top Ritz pair (from a warm start also the second pair's, _warm_err), stopping when it is
<= tol or after max_passes (then converged is False). Narrow
matrices are exact as in C: cols <= 32 the whole Gram matrix, and rows <= 128 (< cols, <=
krylov_dim) the Gram matrix of the rows side.

Where it differs from the C engine, and why the reported error stays honest:
- Products. Every product with G is computed in float64 on the tensor's device (A, stored as
  float32, float16 or bfloat16, converted exactly to float64, in row chunks of at most 2^22
  elements when the matrix is larger). The C engine at tol >= 1e-6 keeps its products in f32
  runs added into f64 and so never reports rel_err below 1e-7; here all arithmetic on the
  vectors is float64 (the C engine's all-f64 path, tol < 1e-6), so rel_err is reported as the
  bound gives it. Float64 on a GPU is slower than float32 (a pass is 2 x 4 matrix-vector
  products, bound by reading A), but TF32 or reduced-precision matmuls never touch the estimate.
- The projected eigenproblem (n x n, n <= krylov_dim) and the QR coupling of each block are
  solved on the host in float64 with numpy (the C engine uses LAPACK's dsbevx and Jacobi), from
  the coefficients each pass copies back: n x bs numbers, one synchronisation per pass.
Only the Lanczos method is here (the Monitor's); power iteration and the exact mode are not.

linear_metrics: a linear layer's metrics from these estimates and float64 sums of squares taken
on the device, turned into the library's metrics by stab_linear_metrics_assemble (the C code
stab_layer_metrics itself uses), so that only scalars leave the device.
"""

import ctypes

import numpy as np

from ._lib import Layer as _lib_Layer
from ._lib import Metrics, SigmaResult, _proto, check, lib

SMALL_COLS = 32    # spectral.c: exact Gram matrix for at most this many columns
FEW_ROWS = 128     # spectral.c: exact rows-side Gram matrix from a cold start
BLOCK = 4
CHUNK_ELEMS = 1 << 22  # a float64 copy of at most this many elements at a time (32 MiB)
_GOLD = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1


def _torch():
    import torch
    return torch


def cold_start(n, seed):
    """The C engine's cold-start vector (spectral.c cold_start): splitmix64 of seed, in [-1, 1),
    unit norm, float64 numpy. The same numbers as C's, so both start from the same vector."""
    with np.errstate(over="ignore"):
        s0 = np.uint64((seed ^ _GOLD) & _M64)
        i = np.arange(1, n + 1, dtype=np.uint64)
        z = s0 + i * np.uint64(_GOLD)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    x = (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 * 2.0 - 1.0
    return x / np.sqrt(x @ x)


class _Gram:
    """G = D^T D, D = A or A - B, applied in float64 on A's device."""

    def __init__(self, a, b):
        self.rows, self.cols = a.shape
        self.a, self.b = a, b
        step = max(1, CHUNK_ELEMS // max(1, self.cols))
        self.chunks = [(r, min(self.rows, r + step)) for r in range(0, self.rows, step)]
        # converted once per estimate when small enough (the C engine's WHOLE_FLOATS)
        self.whole = self._f64(0, self.rows) if self.rows * self.cols <= CHUNK_ELEMS else None

    def _f64(self, r0, r1):
        d = self.a[r0:r1].to(_torch().float64)
        if self.b is not None:
            d = d - self.b[r0:r1].to(d.dtype)
        return d

    def matrix_chunks(self):
        if self.whole is not None:
            yield self.whole
        else:
            for r0, r1 in self.chunks:
                yield self._f64(r0, r1)

    def apply(self, x):
        """G x for the k vectors x (k x cols, float64 on the device): k x cols."""
        y = None
        for d in self.matrix_chunks():
            t = (d @ x.T).T @ d  # k x cols: (D x_j)^T D
            y = t if y is None else y + t
        return y


def _top_eig(h):
    """The eigenpairs of the symmetric h (numpy float64), ascending."""
    return np.linalg.eigh(h)


def _small_gram(g, v_out):
    """cols <= SMALL_COLS: G formed whole (in the C engine's cols/2 two-vector passes), its top
    eigenpair on the host: exact."""
    torch = _torch()
    cols = g.cols
    dev = g.a.device
    G = None
    for d in g.matrix_chunks():
        t = d.T @ d
        G = t if G is None else G + t
    if not bool(torch.isfinite(G).all()):
        return {"sigma": float("nan"), "rel_err": float("nan"), "passes": (cols + 1) // 2,
                "converged": False, "nonfinite": True, "v": v_out}
    w, z = _top_eig(G.cpu().numpy())
    theta = w[-1]
    return {"sigma": float(np.sqrt(max(theta, 0.0))), "rel_err": 0.0, "passes": (cols + 1) // 2,
            "converged": True, "nonfinite": False,
            "v": torch.from_numpy(z[:, -1].copy()).to(dev)}


def _few_rows(g, v_out):
    """rows < cols, rows <= FEW_ROWS, warm start or cold: K = D D^T (rows x rows), its top eigenpair
    on the host, v = D^T u / |D^T u|: exact, one pass."""
    torch = _torch()
    d = g.whole if g.whole is not None else torch.cat(list(g.matrix_chunks()))
    if not bool(torch.isfinite(d).all()):
        return {"sigma": float("nan"), "rel_err": float("nan"), "passes": 1, "converged": False,
                "nonfinite": True, "v": v_out}
    K = (d @ d.T).cpu().numpy()
    if np.max(np.diag(K)) == 0.0:
        return {"sigma": 0.0, "rel_err": 0.0, "passes": 1, "converged": True, "nonfinite": False,
                "v": v_out}
    w, z = _top_eig(K)
    u = torch.from_numpy(z[:, -1].copy()).to(d.device)
    x = u @ d
    nn = float(x @ x)
    v = x / np.sqrt(nn) if nn > 0.0 else v_out
    return {"sigma": float(np.sqrt(max(w[-1], 0.0))), "rel_err": 0.0, "passes": 1,
            "converged": True, "nonfinite": False, "v": v}


WARM_TRUST_TOL = 1e-2  # spectral.c


def _warm_err(R, w, zz, n, bs, found, r, theta, tiny, tol):
    """spectral.c's warm_err: the claim of a warm start from its top two Ritz pairs (the second
    stands for the block's random vectors; trusted once converged to max(tol, WARM_TRUST_TOL))."""
    if found < 2:
        return float("inf")
    theta2 = w[-2]
    r2 = float(np.linalg.norm(np.triu(R) @ zz[:, -2][n - bs:n]))
    tol2 = max(tol, WARM_TRUST_TOL)
    if not (r2 <= 2.0 * tol2 * theta2 or r2 <= tiny):
        return float("inf")
    above = theta2 + r2 - theta
    lam = max(above, r)
    return 0.5 * lam / theta if theta > 0.0 else (float("inf") if lam > 0.0 else 0.0)


def sigma(a, b=None, v=None, tol=1e-3, max_passes=1000, krylov_dim=128, seed=0x5EED):
    """sigma(a), or sigma(a - b) when b is given, of a 2-D tensor on any device (float32,
    float16 or bfloat16, read as stored; b the same shape). v: the warm-start vector (a float64
    tensor of a's column count, on a's device) from the previous call, or None (cold start).
    Returns a dict: sigma, rel_err (the residual bound, as stab_spectral_norm reports it),
    passes, converged, nonfinite, and v, the new estimate of the top right singular vector
    (float64, on a's device) to pass back next time."""
    torch = _torch()
    if not isinstance(a, torch.Tensor) or a.dim() != 2:
        raise ValueError("_device.sigma: a must be a 2-D torch tensor, got %r" % (type(a).__name__,))
    if a.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError("_device.sigma: a must be float32, float16 or bfloat16, got %s" % a.dtype)
    if b is not None and (b.shape != a.shape or b.device != a.device):
        raise ValueError("_device.sigma: b must have a's shape %s and device %s, got %s on %s"
                         % (tuple(a.shape), a.device, tuple(b.shape), b.device))
    rows, cols = a.shape
    if rows == 0 or cols == 0:
        raise ValueError("_device.sigma: a has a zero side (%d x %d)" % (rows, cols))
    if not (1e-12 <= tol < 0.5):
        raise ValueError("_device.sigma: tol must be in [1e-12, 0.5), got %r" % (tol,))
    if not (1 <= max_passes <= 1000000 and 2 <= krylov_dim <= 1024):
        raise ValueError("_device.sigma: max_passes must be in [1, 1000000] and krylov_dim in [2, 1024], got %r and %r"
                         % (max_passes, krylov_dim))
    dev = a.device
    f64 = torch.float64
    g = _Gram(a.detach(), None if b is None else b.detach())
    if cols <= SMALL_COLS:
        return _small_gram(g, v)
    M = max(2 * BLOCK, ((krylov_dim + 1) & ~1) // BLOCK * BLOCK)  # as stabi_krylov_basis and spectral.c
    # the start vector: the caller's when usable (finite, not zero), else C's cold start
    warm = False
    if v is not None:
        vv = v.detach().to(device=dev, dtype=f64).reshape(-1)
        if vv.numel() != cols:
            raise ValueError("_device.sigma: v has %d entries, a has %d columns" % (vv.numel(), cols))
        nn = float(vv @ vv)
        warm = np.isfinite(nn) and nn > 0.0
    if rows < cols and rows <= FEW_ROWS and rows <= M:  # exact, warm or cold (spectral.c)
        return _few_rows(g, v)
    bs = BLOCK  # warm or cold; a warm vector takes the first random vector's place (spectral.c)
    Q = torch.zeros((M, cols), dtype=f64, device=dev)
    Q[0] = vv / np.sqrt(nn) if warm else torch.from_numpy(cold_start(cols, seed)).to(dev)
    for c in range(1, bs):  # the rest of the first block: random, orthonormal
        q = torch.from_numpy(cold_start(cols, (seed + c) & _M64)).to(dev)
        for _ in range(2):
            q = q - (Q[:c] @ q) @ Q[:c]
        Q[c] = q / torch.sqrt(q @ q)
    H = np.zeros((M, M))
    m = 0
    theta, err, scale_seen = 0.0, float("inf"), 0.0
    ritz_n, ritz = 0, None
    k = 0
    while k < max_passes:
        Z = g.apply(Q[m:m + bs])
        k += 1
        if not bool(torch.isfinite(Z).all()):
            return {"sigma": float("nan"), "rel_err": float("nan"), "passes": k, "converged": False,
                    "nonfinite": True, "v": v}
        n = m + bs
        # full reorthogonalisation against the basis, twice; the coefficients are H's columns
        for _ in range(2):
            cc = Q[:n] @ Z.T  # n x bs
            Z = Z - cc.T @ Q[:n]
            H[:n, m:n] += cc.cpu().numpy()
        scale_seen = max(scale_seen, float(np.max(np.abs(np.diag(H)[:n]))))
        tiny = 64 * np.finfo(np.float64).eps * scale_seen
        # QR of the remainder, Z = [z_0 .. z_bs-1] R: the coupling to the next block
        R = np.zeros((bs, bs))
        for c in range(bs):
            z = Z[c]
            before = float(z @ z)
            for _ in range(2):
                if c:
                    d = Z[:c] @ z
                    z = z - d @ Z[:c]
                    R[:c, c] += d.cpu().numpy()
            if c > 0 and float(z @ z) < 0.5 * before:
                z = z - (Q[:n] @ z) @ Q[:n]
            nz = float(torch.sqrt(z @ z))
            if nz > tiny:
                z = z / nz
                R[c, c] = nz
            else:  # negligible: a random vector orthogonal to the basis and the block so far
                z = torch.from_numpy(cold_start(cols, (seed + bs * (k + 1) + c) & _M64)).to(dev)
                for _ in range(2):
                    z = z - (Q[:n] @ z) @ Q[:n]
                    if c:
                        z = z - (Z[:c] @ z) @ Z[:c]
                nr = float(torch.sqrt(z @ z))
                z = z / nr if nr > 1e-8 else torch.zeros_like(z)
                R[c, c] = 0.0
            Z[c] = z
        # the projected matrix: H's upper triangle within its band (2 bs - 1), symmetric
        band = 2 * bs - 1
        hu = np.triu(H[:n, :n]) - np.triu(H[:n, :n], band + 1)
        w, zz = _top_eig(hu + np.triu(hu, 1).T)
        found = min(bs, n)
        theta = w[-1]
        ritz, ritz_n = zz[:, -1], n
        if scale_seen == 0.0:  # the zero matrix
            theta, err = 0.0, 0.0
            break
        r = float(np.linalg.norm(np.triu(R) @ ritz[n - bs:n]))
        err = 0.5 * r / theta if theta > 0.0 else (float("inf") if r > 0.0 else 0.0)
        if warm and n >= cols:
            err = 0.0
        elif warm:  # the random part must agree: spectral.c's warm_err
            err = _warm_err(R, w, zz, n, bs, found, r, theta, tiny, tol)
        if err <= tol or (r <= tiny and not warm) or n >= cols:
            break
        if n + bs > M:  # restart from the leading Ritz vectors, the top one first
            top = torch.from_numpy(np.ascontiguousarray(zz[:, ::-1][:, :found].T)).to(dev)
            Qn = top @ Q[:n]
            Q.zero_()
            Q[:found] = Qn
            H[:] = 0.0
            m = 0
            ritz, ritz_n = np.ones(1), 1
            continue
        Q[n:n + bs] = Z
        m = n
    x = torch.from_numpy(np.ascontiguousarray(ritz)).to(dev) @ Q[:ritz_n] if ritz is not None else None
    vout = v
    if x is not None:
        nn = float(x @ x)
        if nn > 0.0:
            vout = x / np.sqrt(nn)
    return {"sigma": float(np.sqrt(max(theta, 0.0))), "rel_err": float(err), "passes": k,
            "converged": bool(err <= tol), "nonfinite": False, "v": vout}


def _sumsq(a, b=None):
    """||A||_F^2, or ||A - B||_F^2, in float64 on A's device (the C library's f64 sums), the
    float64 copy made in chunks as for the products."""
    def rows(t):
        return None if t is None else t.detach().reshape(t.shape[0] if t.dim() > 1 else 1, -1)
    return float(sum(float((d * d).sum()) for d in _Gram(rows(a), rows(b)).matrix_chunks()))


def _rms(a, b=None):
    return float(np.sqrt(_sumsq(a, b) / a.numel()))


def linear_metrics(weight, bias=None, before=None, before_bias=None, v=None, v_update=None, tol=1e-3,
                   max_passes=1000, krylov_dim=128, seed=0x5EED, in_major=False):
    """A linear layer's metrics measured on its tensors' device: sigma(W) and, with before (W
    before the step, on the same device), sigma(W - before) by sigma() above; ||b||_RMS, ||db||_RMS,
    ||W||_F^2 and ||dW||_F^2 in float64 by torch; and stab_linear_metrics_assemble (the C library)
    to turn them into the metrics stab_layer_metrics gives. weight: the stored matrix, out-major
    [d_out][d_in] (a convolution's [C_out][C_in * prod(k)] view) or with in_major [d_in][d_out]
    (Hugging Face's Conv1D), measured as stored, as the C library does. v, v_update: the warm-start vectors of the last call (None: cold). Returns
    (metrics, v, v_update): metrics a stabmeter._lib.Metrics, the vectors for the next call."""
    if weight.dim() != 2:
        raise ValueError("_device.linear_metrics: weight must be 2-D (the stored [d_out][d_in]), got shape %s"
                         % (tuple(weight.shape),))
    for what, t, like in (("bias", bias, None), ("before", before, weight), ("before_bias", before_bias, bias)):
        if t is None:
            continue
        if t.device != weight.device or t.dtype != weight.dtype:
            raise ValueError("_device.linear_metrics: %s must be on weight's device %s in its dtype %s, got %s %s"
                             % (what, weight.device, weight.dtype, t.device, t.dtype))
        want = (weight.shape[1 if in_major else 0],) if like is None else tuple(like.shape)
        if tuple(t.shape) != want:
            raise ValueError("_device.linear_metrics: %s must have shape %s, got %s" % (what, want, tuple(t.shape)))
    if (before_bias is None) != (before is None or bias is None):
        raise ValueError("_device.linear_metrics: before_bias is needed exactly when before and bias are given")
    parts = _LinearParts()
    parts.d_out, parts.d_in = reversed(weight.shape) if in_major else weight.shape
    kw = dict(tol=tol, max_passes=max_passes, krylov_dim=krylov_dim, seed=seed)
    w = sigma(weight, v=v, **kw)
    parts.weight = SigmaResult(w["sigma"], w["rel_err"], w["passes"], int(w["converged"]), int(w["nonfinite"]))
    parts.bias_rms = _rms(bias) if bias is not None else 0.0
    vu = v_update
    if before is not None:
        u = sigma(weight, before, v=v_update, **kw)
        vu = u["v"]
        parts.with_update = 1
        parts.update = SigmaResult(u["sigma"], u["rel_err"], u["passes"], int(u["converged"]), int(u["nonfinite"]))
        parts.bias_update_rms = _rms(bias, before_bias) if bias is not None else 0.0
        parts.weight_sumsq = _sumsq(weight)
        parts.update_sumsq = _sumsq(weight, before)
    out = Metrics()
    check(lib.stab_linear_metrics_assemble(ctypes.byref(parts), ctypes.byref(out)))
    return out, w["v"], vu


class _LinearParts(ctypes.Structure):
    """stab_linear_parts, field for field as include/stabmeter/layer.h has it."""
    _fields_ = [("d_in", ctypes.c_size_t), ("d_out", ctypes.c_size_t), ("weight", SigmaResult),
                ("bias_rms", ctypes.c_double), ("with_update", ctypes.c_int), ("update", SigmaResult),
                ("bias_update_rms", ctypes.c_double), ("weight_sumsq", ctypes.c_double),
                ("update_sumsq", ctypes.c_double)]


_proto("stab_linear_metrics_assemble", ctypes.c_int, ctypes.POINTER(_LinearParts), ctypes.POINTER(Metrics))
_proto("stab_monitor_add_external", ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_lib_Layer), ctypes.POINTER(ctypes.c_size_t))
_proto("stab_monitor_set_metrics", ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(Metrics), ctypes.POINTER(ctypes.c_double))


class Mirrors:
    """stabmeter.torch.Monitor's parameters that are not on the CPU (every one with on_device):
    each gets a host copy of its own dtype, which the library's description reads (names,
    kinds, shapes) and the layers measured by the C monitor read, copied from the device before
    each snapshot and measurement. A linear layer whose tensors are all such copies is measured
    on the device instead (linear_metrics: only scalars come back), registered with the C
    monitor as an external layer whose metrics are set after each measurement, so the trace is
    written from the host as for any layer; its tensors are never copied unless another layer
    (an attention bound, a tied table) reads them."""

    def __init__(self, on_device=False):
        self.all = on_device  # CPU tensors too: the device path run where the tests run
        self.pairs = {}       # host data_ptr -> (host copy, device tensor)
        self.linear = []      # [monitor index, weight, bias, before, before_bias, v, v_update]
        self.copied = set()   # host data_ptrs that C layers read
        self.tol = 1e-3

    def host(self, t, name):
        """t itself on the CPU (unless every tensor is mirrored), else its host copy."""
        if t.device.type == "cpu" and not self.all:
            return t
        for h, d in self.pairs.values():  # a shared tensor (a tied table) has one copy
            if d.data_ptr() == t.data_ptr() and d.shape == t.shape and d.device == t.device:
                return h
        h = _torch().empty(t.shape, dtype=t.dtype, device="cpu")
        try:
            h.copy_(t)
        except (RuntimeError, NotImplementedError) as e:
            raise TypeError("Monitor: parameter %s is on %s and cannot be copied to the host, which the "
                            "Monitor does once and for the layers it measures there: %s" % (name, t.device, e)) from None
        self.pairs[h.data_ptr()] = (h, t)
        return h

    def device_of(self, t):
        """The tensor the host copy t mirrors (t itself when it mirrors none): the one the
        training writes, whose torch version says whether it was written."""
        pair = self.pairs.get(t.data_ptr())
        return pair[1] if pair is not None and pair[0] is t else t

    def _find(self, ptr):
        for h, d in self.pairs.values():
            lo = h.data_ptr()
            if lo <= ptr < lo + h.numel() * h.element_size():
                return h, d, (ptr - lo) // h.element_size()
        return None

    def add(self, m, layer, kind):
        """Registers a layer: a linear one on mirrored tensors as external (measured on the device,
        returns True), else the pointers it reads are copied every step (returns False)."""
        ptrs = [p for p in (layer.weight, layer.bias, layer.weight_k) if p]
        found = [self._find(p) for p in ptrs]
        if kind != "linear" or not all(found) or len({f[1].device for f in found}) != 1:
            self.copied.update(f[0].data_ptr() for f in found if f)
            return False
        # the stored matrix: out-major [d_out][d_in] (the linear kind's usual layout) unless in-major
        rows, cols = (layer.d_in, layer.d_out) if layer.layout == 2 else (layer.d_out, layer.d_in)
        _, dev, off = found[0]
        w = dev.detach().as_strided((rows, cols), (layer.ld or cols, 1), dev.storage_offset() + off)
        b = None
        if layer.bias:
            _, bdev, boff = found[1]
            b = bdev.detach().as_strided((layer.d_out,), (1,), bdev.storage_offset() + boff)
        index = ctypes.c_size_t()
        check(lib.stab_monitor_add_external(m, ctypes.byref(layer), ctypes.byref(index)))
        self.linear.append([index.value, w, b, None, None, None, None, layer.layout == 2])
        return True

    def refresh(self):
        """Copies the device tensors that the C monitor's layers read to their host copies."""
        for ptr in self.copied:
            h, d = self.pairs[ptr]
            h.copy_(d)

    def snapshot(self):
        """The device layers' weights before the step, on the device (buffers made once)."""
        for L in self.linear:
            L[3] = L[1].clone() if L[3] is None else L[3].copy_(L[1])
            if L[2] is not None:
                L[4] = L[2].clone() if L[4] is None else L[4].copy_(L[2])

    def measure(self, m, with_update):
        """Measures each device layer where it is and sets its metrics in the C monitor."""
        for L in self.linear:
            index, w, b, before, before_b = L[:5]
            upd = with_update and before is not None
            met, L[5], vu = linear_metrics(w, b, before if upd else None, before_b if upd and b is not None else None,
                                           v=L[5], v_update=L[6], tol=self.tol, in_major=L[7])
            if upd:
                L[6] = vu
            check(lib.stab_monitor_set_metrics(m, index, ctypes.byref(met), None))
