"""Tests of examples/pytorch/synthetic_data.py, the NumPy port of worker/synthetic_data.cc that
the PyTorch examples and bench_python train on: a sample depends on (seed, stream, index)
alone, so any cut of a range into blocks (train_dlrm.py's data worker doubles its blocks)
gives the same samples; and the per-rank values computed once per distinct rank of a block
(_distinct, both of its paths) are np.unique's. No server, no torch.

    python3 python/tests/test_synthetic_data.py
"""

import os
import sys
import unittest

import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "pytorch"))
import synthetic_data  # noqa: E402
from synthetic_data import SyntheticData  # noqa: E402


class SyntheticDataTest(unittest.TestCase):
    def test_distinct_equals_numpy_unique_on_both_paths(self):
        rng = np.random.default_rng(3)
        for card, n in ((5, 100), (20000, 4096), (10 ** 9, 5000), (10 ** 6, 1000), (1, 7)):
            ranks = rng.integers(1, card + 1, n).astype(np.uint64)
            uniq, at = synthetic_data._distinct(ranks, card)
            want, want_at = np.unique(ranks, return_inverse=True)
            np.testing.assert_array_equal(uniq, want)
            self.assertEqual(uniq.dtype, np.uint64)
            np.testing.assert_array_equal(at, want_at.ravel())
            np.testing.assert_array_equal(uniq[at], ranks)

    def test_samples_do_not_depend_on_the_blocks(self):
        for cap in (20000, 10 ** 9):
            data = SyntheticData(seed=1, max_cardinality=cap)
            whole = data.generate(0, 100, 3000)
            parts = [data.generate(0, 100 + s, e - s)
                     for s, e in ((0, 1), (1, 1000), (1000, 1024), (1024, 3000))]
            for k in whole:
                np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), whole[k],
                                              err_msg="%s (cap %d)" % (k, cap))
            # Another stream, another seed: other samples.
            self.assertFalse(np.array_equal(data.generate(1, 100, 3000)["keys"], whole["keys"]))
            self.assertFalse(np.array_equal(
                SyntheticData(seed=2, max_cardinality=cap).generate(0, 100, 3000)["keys"],
                whole["keys"]))

    def test_shapes_and_absent_fields(self):
        b = SyntheticData(seed=1).generate(0, 0, 2048)
        self.assertEqual(b["keys"].shape, (2048, 26))
        self.assertEqual(b["dense"].shape, (2048, 13))
        self.assertTrue((b["keys"][~b["present"]] == 0).all())
        self.assertTrue((b["keys"][b["present"]] != 0).all())
        # The field in the top 8 bits of each present key.
        fields = (b["keys"] >> np.uint64(56)).astype(np.int64)
        self.assertTrue((fields[b["present"]] ==
                         np.broadcast_to(np.arange(26), (2048, 26))[b["present"]]).all())


if __name__ == "__main__":
    unittest.main()
