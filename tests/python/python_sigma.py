"""stabmeter.sigma against LAPACK's SVD in f64 (numpy.linalg.svd) on the same arrays: numpy
and torch, contiguous and a block of rows' columns read in place with a row stride."""

import math
import unittest

import numpy as np
import torch

import stabmeter


def svd_top(a):
    return float(np.linalg.svd(np.asarray(a, dtype=np.float64), compute_uv=False)[0])


class Sigma(unittest.TestCase):
    def setUp(self):
        r = np.random.default_rng(7)
        self.a = r.standard_normal((200, 150)).astype(np.float32)
        self.a[:, 3] *= 6  # a clear top singular value

    def within(self, got, want, tol):
        # Lanczos gives a lower bound (a Ritz value) within tol of the top singular value
        self.assertLessEqual(got, want * (1 + 1e-6))
        self.assertGreaterEqual(got, want * (1 - tol))

    def test_numpy_contiguous(self):
        self.within(stabmeter.sigma(self.a), svd_top(self.a), 1e-3)
        self.within(stabmeter.sigma(self.a, tol=1e-6), svd_top(self.a), 1e-6)

    def test_exact(self):
        r = stabmeter.sigma(self.a, method="exact", full=True)
        self.assertTrue(r["converged"])
        self.assertAlmostEqual(r["sigma"] / svd_top(self.a), 1.0, delta=1e-12)

    def test_row_stride_in_place(self):
        block = self.a[10:90, 20:70]  # 80 rows of 50, stride 150: read where it is
        self.assertFalse(block.flags.c_contiguous)
        self.within(stabmeter.sigma(block, tol=1e-6), svd_top(block), 1e-6)

    def test_torch(self):
        t = torch.from_numpy(self.a).requires_grad_(True)  # detached inside, no copy
        self.within(stabmeter.sigma(t, tol=1e-6), svd_top(self.a), 1e-6)
        self.within(stabmeter.sigma(t[5:50, :40], tol=1e-6), svd_top(self.a[5:50, :40]), 1e-6)

    def test_nonfinite_is_a_flag(self):
        b = self.a.copy()
        b[3, 4] = np.nan
        r = stabmeter.sigma(b, full=True)
        self.assertTrue(r["nonfinite"])
        self.assertTrue(math.isnan(r["sigma"]))

    def test_version(self):
        self.assertRegex(stabmeter.__version__, r"^\d+\.\d+\.\d+$")


if __name__ == "__main__":
    unittest.main()
