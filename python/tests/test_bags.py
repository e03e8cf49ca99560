"""Tests of tessera.torch's CPU kernels in the compiled core (python/bags.cc): unique_keys,
bag_sum and bag_sum_backward against plain NumPy on random batches, and their refusals.

Run by ctest (label `python`) with PYTHONPATH=build/python. By hand:

    PYTHONPATH=build/python python3 python/tests/test_bags.py
"""

import unittest

import numpy as np

import tessera._tessera as core


def ref_bag_sum(rows, inverse, bounds, weights, num_bags):
    out = np.zeros((num_bags, rows.shape[1]), np.float64)
    for j in range(num_bags):
        lo, hi = (bounds[j], bounds[j + 1]) if bounds is not None else (j, j + 1)
        for i in range(lo, hi):
            out[j] += (weights[i] if weights is not None else 1.0) * rows[inverse[i]]
    return out


def ref_backward(grad_out, inverse, bounds, weights, num_rows):
    g = np.zeros((num_rows, grad_out.shape[1]), np.float64)
    for j in range(grad_out.shape[0]):
        lo, hi = (bounds[j], bounds[j + 1]) if bounds is not None else (j, j + 1)
        for i in range(lo, hi):
            g[inverse[i]] += (weights[i] if weights is not None else 1.0) * grad_out[j]
    return g


def random_bags(rng, num_bags, max_len):
    lengths = rng.integers(0, max_len + 1, num_bags)  # empty bags included
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


class UniqueKeysTest(unittest.TestCase):
    def test_matches_numpy_unique(self):
        rng = np.random.default_rng(1)
        for n, span in ((0, 1), (1, 1), (50, 5), (5000, 300), (40000, 2 ** 64 - 1)):
            # Few distinct keys (many repeats) and the full 64-bit range (top bit set).
            keys = rng.integers(0, span, n, dtype=np.uint64, endpoint=True) \
                if span < 2 ** 63 else rng.integers(0, 2 ** 63, n, dtype=np.uint64) * 2 + 1
            uniq, inverse = core.unique_keys(keys)
            want, want_inv = np.unique(keys, return_inverse=True)
            self.assertEqual(uniq.dtype, np.uint64)
            self.assertEqual(inverse.dtype, np.int64)
            np.testing.assert_array_equal(uniq, want)
            np.testing.assert_array_equal(inverse, want_inv.ravel())
            np.testing.assert_array_equal(uniq[inverse], keys)

    def test_refuses_other_dtypes_and_shapes(self):
        with self.assertRaisesRegex(TypeError, "keys: expected a C-contiguous uint64"):
            core.unique_keys(np.arange(4, dtype=np.int64))
        with self.assertRaisesRegex(TypeError, "keys"):
            core.unique_keys([1, 2, 3])
        with self.assertRaisesRegex(TypeError, "C-contiguous"):
            core.unique_keys(np.arange(8, dtype=np.uint64)[::2])
        with self.assertRaisesRegex(ValueError, "1-D"):
            core.unique_keys(np.zeros((2, 2), np.uint64))


class BagSumTest(unittest.TestCase):
    def test_forward_and_backward_match_numpy(self):
        rng = np.random.default_rng(2)
        for dim in (1, 8, 13):
            for pooled in (True, False):
                for weighted in (False, True):
                    num_rows, num_bags = 37, 60
                    bounds = random_bags(rng, num_bags, 5) if pooled else None
                    n = int(bounds[-1]) if pooled else num_bags
                    inverse = rng.integers(0, num_rows, n).astype(np.int64)  # repeats
                    weights = rng.standard_normal(n).astype(np.float32) if weighted else None
                    rows = rng.standard_normal((num_rows, dim)).astype(np.float32)
                    out = np.full((num_bags, dim), np.nan, np.float32)  # overwritten
                    core.bag_sum(rows, inverse, bounds, weights, out)
                    np.testing.assert_allclose(
                        out, ref_bag_sum(rows, inverse, bounds, weights, num_bags),
                        rtol=1e-5, atol=1e-5)
                    grad_out = rng.standard_normal((num_bags, dim)).astype(np.float32)
                    start = rng.standard_normal((num_rows, dim)).astype(np.float32)
                    grad_rows = start.copy()  # added to, not cleared
                    core.bag_sum_backward(grad_out, inverse, bounds, weights, grad_rows)
                    np.testing.assert_allclose(
                        grad_rows,
                        start + ref_backward(grad_out, inverse, bounds, weights, num_rows),
                        rtol=1e-5, atol=1e-5)

    def test_one_dimensional_rows_when_dim_is_one(self):
        rows = np.array([1.0, 2.0, 4.0], np.float32)
        out = np.empty(2, np.float32)
        core.bag_sum(rows, np.array([0, 2, 2, 1], np.int64), np.array([0, 3, 4], np.int64),
                     None, out)
        np.testing.assert_array_equal(out, [9.0, 2.0])

    def test_refusals(self):
        rows = np.ones((3, 2), np.float32)
        inv = np.array([0, 1, 2], np.int64)
        out = np.empty((1, 2), np.float32)
        bounds = np.array([0, 3], np.int64)
        with self.assertRaisesRegex(ValueError, r"inverse\[1\] = 7 is outside the 3 rows"):
            core.bag_sum(rows, np.array([0, 7, 1], np.int64), bounds, None, out)
        with self.assertRaisesRegex(ValueError, r"inverse\[0\] = -1 is outside"):
            core.bag_sum_backward(out, np.array([-1, 0, 1], np.int64), bounds, None,
                                  np.zeros((3, 2), np.float32))
        with self.assertRaisesRegex(ValueError, "bounds: must run from 0 to the 3 values"):
            core.bag_sum(rows, inv, np.array([0, 2], np.int64), None, out)
        with self.assertRaisesRegex(ValueError, r"bounds: decreasing at bag 1 \(3 then 2\)"):
            core.bag_sum(rows, inv, np.array([0, 3, 2, 3], np.int64), None,
                         np.empty((3, 2), np.float32))
        with self.assertRaisesRegex(ValueError, r"out: expected shape \(1, 2\)"):
            core.bag_sum(rows, inv, bounds, None, np.empty((2, 2), np.float32))
        with self.assertRaisesRegex(ValueError, "weights: expected a 1-D array of 3 entries"):
            core.bag_sum(rows, inv, bounds, np.ones(2, np.float32), out)
        with self.assertRaisesRegex(TypeError, "out: expected a C-contiguous float32"):
            core.bag_sum(rows, inv, bounds, None, np.empty((1, 2), np.float64))
        with self.assertRaisesRegex(TypeError, "inverse: expected a C-contiguous int64"):
            core.bag_sum(rows, inv.astype(np.int32), bounds, None, out)
        ro = np.zeros((3, 2), np.float32)
        ro.flags.writeable = False
        with self.assertRaisesRegex(ValueError, "grad_rows: is read-only"):
            core.bag_sum_backward(out, inv, bounds, None, ro)


if __name__ == "__main__":
    unittest.main()
