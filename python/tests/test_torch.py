"""Tests of `tessera.torch` against real tessera-server processes on 127.0.0.1.

Each training test runs the same batches through a tessera.torch module (the servers' optimizer)
and through pure torch (nn.EmbeddingBag / nn.Embedding / nn.Linear with torch's optimizer of the
same definition), and checks the rows after every step within 1e-5. Run by ctest (label
`python`), which sets PYTHONPATH and TESSERA_SERVER. By hand:

    PYTHONPATH=build/python TESSERA_SERVER=build/tessera-server python3 python/tests/test_torch.py
"""

import json
import os
import subprocess
import sys
import unittest

import numpy as np

try:
    import torch
except ImportError:
    torch = None

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
from test_client import LocalCluster  # noqa: E402

import tessera  # noqa: E402

if torch is not None:
    import tessera.torch as tt

NUM_KEYS = 12
DIM = 4
LR = 0.1
ACC0 = 0.1
TOL = 1e-5


def key_of(i):
    return i * 1000003 + 7  # sparse, large keys; the reference uses the index i


def make_batch(rng, num_bags, max_len, weights):
    """One feature's batch: (reference indices, Bags). Keys repeat within and across bags."""
    lengths = rng.integers(0, max_len + 1, size=num_bags)
    idx = rng.integers(0, NUM_KEYS // 2, size=int(lengths.sum()))  # half the keys: repeats
    w = torch.from_numpy(rng.uniform(0.5, 2.0, size=len(idx)).astype(np.float32)) \
        if weights else None
    keys = torch.from_numpy(key_of(idx).astype(np.int64))
    return (torch.from_numpy(idx), torch.from_numpy(lengths), w,
            tt.Bags(keys, lengths=torch.from_numpy(lengths), weights=w))


def reference_optimizer(kind, params):
    # ps/optimizer.cc: SGD w -= lr * g; Adagrad a += g^2, w -= lr * g / (sqrt(a) + eps), a
    # starting at initial_accumulator: torch's SGD and Adagrad with the same numbers.
    if kind == "sgd":
        return torch.optim.SGD(params, lr=LR)
    return torch.optim.Adagrad(params, lr=LR, initial_accumulator_value=ACC0, eps=1e-8)


def spec_of(kind):
    if kind == "sgd":
        return tessera.OptimizerSpec("sgd", learning_rate=LR)
    return tessera.OptimizerSpec("adagrad", learning_rate=LR, initial_accumulator=ACC0,
                                 epsilon=1e-8)


def loss_of(outs):
    # Non-linear in the rows, so the gradients depend on the values pulled.
    a, b = outs
    return (a * a).sum() + 0.5 * (a.sum(0) * b.sum(0)).sum() + (b * b * b).sum()


@unittest.skipIf(torch is None, "torch is not installed (Debian: python3-torch); "
                                "tessera.torch is not tested")
class TorchModuleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.servers = LocalCluster()
        cls.addClassCleanup(cls.servers.remove)
        cls.servers.start()
        cls.client = tessera.Client(cls.servers.cluster, request_timeout_ms=30000)
        cls.addClassCleanup(cls.client.close)

    def initial_rows(self, table):
        keys = key_of(np.arange(NUM_KEYS)).astype(np.uint64)
        return torch.from_numpy(self.client.pull(table, keys).copy())

    def server_rows(self, table):
        return self.initial_rows(table)

    def check_bags(self, name, optimizer, pooling, weights, device="cpu", steps=5):
        init = tessera.InitializerSpec("uniform", a=-0.5, b=0.5, seed=3)
        ebc = tt.EmbeddingBagCollection(self.client, [tt.TableConfig(
            name, DIM, ["a", "b"], spec_of(optimizer), init, pooling)], device=device)
        ref = torch.nn.EmbeddingBag(NUM_KEYS, DIM, mode="sum")
        with torch.no_grad():
            ref.weight.copy_(self.initial_rows(name))
        ref.to(device)
        opt = reference_optimizer(optimizer, ref.parameters())
        rng = np.random.default_rng(11)
        for step in range(steps):
            fa, fb = make_batch(rng, 6, 4, weights), make_batch(rng, 5, 3, weights)
            for _, _, w, _ in (fa, fb):
                if w is not None:  # the weights' gradients are checked too
                    w.requires_grad_()
            outs = ebc({"a": fa[3], "b": fb[3]})
            refs, ref_weights = [], []
            for idx, lengths, w, _ in (fa, fb):
                if w is not None:
                    w = w.detach().clone().requires_grad_()
                    ref_weights.append(w)
                offsets = torch.cumsum(lengths, 0) - lengths
                if pooling == "mean":
                    # Mean: sum(w_i * row_i) / (keys in the bag); w = 1 without weights.
                    per = torch.repeat_interleave(lengths, lengths).float()
                    w = (w if w is not None else torch.ones(len(idx))) / per
                refs.append(ref(idx.to(device), offsets.to(device),
                                per_sample_weights=None if w is None else w.to(device)))
            for got, want in zip((outs["a"], outs["b"]), refs):
                self.assertEqual(got.device.type, torch.device(device).type)
                torch.testing.assert_close(got, want, rtol=0, atol=TOL,
                                           msg="forward of step %d" % step)
            loss_of((outs["a"], outs["b"])).backward()
            opt.zero_grad()
            loss_of(refs).backward()
            opt.step()
            for (_, _, w, _), want_grad in zip((fa, fb), ref_weights):
                torch.testing.assert_close(w.grad, want_grad.grad.cpu(), rtol=0, atol=TOL,
                                           msg="weights' gradient of step %d" % step)
            ebc.wait_pushes()
            torch.testing.assert_close(self.server_rows(name), ref.weight.detach().cpu(),
                                       rtol=0, atol=TOL, msg="rows after step %d" % step)

    def test_sum_pooling_sgd(self):
        self.check_bags("sum_sgd", "sgd", "sum", weights=False)

    def test_sum_pooling_adagrad(self):
        self.check_bags("sum_adagrad", "adagrad", "sum", weights=False)

    def test_mean_pooling_sgd(self):
        self.check_bags("mean_sgd", "sgd", "mean", weights=False)

    def test_mean_pooling_adagrad(self):
        self.check_bags("mean_adagrad", "adagrad", "mean", weights=False)

    def test_weighted_sum_adagrad(self):
        self.check_bags("wsum_adagrad", "adagrad", "sum", weights=True)

    def test_weighted_mean_sgd(self):
        self.check_bags("wmean_sgd", "sgd", "mean", weights=True)

    @unittest.skipUnless(torch is not None and torch.cuda.is_available(),
                         "no CUDA device: the CUDA path (pinned staging) is not tested here")
    def test_cuda_tensors_adagrad(self):
        self.check_bags("cuda_adagrad", "adagrad", "sum", weights=True, device="cuda")

    def test_unpooled_collection_matches_embedding(self):
        name = "unpooled"
        ec = tt.EmbeddingCollection(self.client, [tt.TableConfig(
            name, DIM, ["seq"], spec_of("adagrad"),
            tessera.InitializerSpec("normal", a=0.0, b=0.3, seed=5))])
        ref = torch.nn.Embedding(NUM_KEYS, DIM)
        with torch.no_grad():
            ref.weight.copy_(self.initial_rows(name))
        opt = reference_optimizer("adagrad", ref.parameters())
        rng = np.random.default_rng(5)
        for step in range(4):
            idx = rng.integers(0, NUM_KEYS // 2, size=9)
            feats = {"seq": torch.from_numpy(key_of(idx).astype(np.int64))}  # plain keys
            if step % 2:  # prefetched after the last step's pushes are final: as fresh
                ec.prefetch(feats)
            got = ec(feats)["seq"]
            self.assertEqual(ec.prefetch_hits, (step + 1) // 2)
            want = ref(torch.from_numpy(idx))
            torch.testing.assert_close(got, want, rtol=0, atol=TOL)
            (got.sum(1) ** 2).sum().backward()
            opt.zero_grad()
            (want.sum(1) ** 2).sum().backward()
            opt.step()
            ec.wait_pushes()
            torch.testing.assert_close(self.server_rows(name), ref.weight.detach(), rtol=0,
                                       atol=TOL, msg="rows after step %d" % step)

    def test_dense_parameters_match_torch_linear(self):
        template = torch.nn.Linear(3, 2)
        dense = tt.TesseraDense(self.client, "dense_lin", template, spec_of("adagrad"),
                                initializers={"bias": tessera.InitializerSpec("constant", a=0.2)})
        ref = torch.nn.Linear(3, 2)
        start = dense.pull()
        self.assertTrue(torch.all(start["bias"] == 0.2))
        self.assertLessEqual(float(start["weight"].abs().max()), 1 / np.sqrt(3) + 1e-6)
        with torch.no_grad():
            ref.weight.copy_(start["weight"])
            ref.bias.copy_(start["bias"])
        opt = reference_optimizer("adagrad", ref.parameters())
        rng = np.random.default_rng(2)
        for step in range(4):
            x = torch.from_numpy(rng.normal(size=(5, 3)).astype(np.float32))
            got, want = dense(x), ref(x)
            torch.testing.assert_close(got, want, rtol=0, atol=TOL)
            (got ** 2).sum().backward()
            opt.zero_grad()
            (want ** 2).sum().backward()
            opt.step()
            now = dense.pull()
            torch.testing.assert_close(now["weight"], ref.weight.detach(), rtol=0, atol=TOL)
            torch.testing.assert_close(now["bias"], ref.bias.detach(), rtol=0, atol=TOL)

    def test_prefetched_rows_equal_a_fresh_pull_and_are_one_step_stale(self):
        name = "prefetch"
        ebc = tt.EmbeddingBagCollection(self.client, [tt.TableConfig(
            name, DIM, ["a"], spec_of("sgd"),
            tessera.InitializerSpec("uniform", a=-1, b=1, seed=9))])
        rng = np.random.default_rng(3)
        first = make_batch(rng, 4, 3, False)[3]
        self.assertGreater(first.num_keys, 0)
        # The second batch: the same keys in another object (a separate prefetch).
        batches = [{"a": first}, {"a": tt.Bags(first.values.clone(), offsets=first.offsets)}]
        # Nothing pushed between the prefetch and the forward: the rows are a fresh pull's.
        ebc.prefetch(batches[0])
        with torch.no_grad():
            got = ebc(batches[0])["a"]
            fresh = torch.nn.functional.embedding_bag(
                torch.arange(batches[0]["a"].num_keys),
                torch.from_numpy(self.client.pull(name, batches[0]["a"].values)),
                batches[0]["a"].offsets, mode="sum")
        torch.testing.assert_close(got, fresh, rtol=0, atol=0)
        self.assertEqual((ebc.prefetch_hits, ebc.prefetch_misses), (1, 0))
        # Prefetched before a step's push: the step's update is not in them (one step stale).
        before = self.client.pull(name, batches[1]["a"].values)
        ebc.prefetch(batches[1])
        ebc(batches[0])["a"].sum().backward()  # a miss: pulls at once
        ebc.wait_pushes()
        after = self.client.pull(name, batches[1]["a"].values)
        self.assertGreater(float(np.abs(after - before).max()), 0.0)  # the push changed them
        with torch.no_grad():
            stale = ebc(batches[1])["a"]
            expected = torch.nn.functional.embedding_bag(
                torch.arange(batches[1]["a"].num_keys), torch.from_numpy(before),
                batches[1]["a"].offsets, mode="sum")
        torch.testing.assert_close(stale, expected, rtol=0, atol=0)
        self.assertEqual((ebc.prefetch_hits, ebc.prefetch_misses), (2, 1))

    def test_prefetch_loader_prefetches_every_batch(self):
        name = "loader"
        ebc = tt.EmbeddingBagCollection(self.client, [tt.TableConfig(name, DIM, ["a"])])
        rng = np.random.default_rng(4)
        batches = [({"a": make_batch(rng, 3, 2, False)[3]}, i) for i in range(5)]
        seen = []
        for feats, i in tt.PrefetchLoader(batches, ebc, features=lambda b: b[0]):
            ebc(feats)["a"].sum().backward()
            seen.append(i)
        ebc.wait_pushes()
        self.assertEqual(seen, list(range(5)))
        self.assertEqual((ebc.prefetch_hits, ebc.prefetch_misses), (5, 0))

    def test_csv_example_learns_through_a_dataloader(self):
        # examples/pytorch/train_csv.py on its generated CSV: a DataLoader with worker
        # processes, PrefetchLoader, four tables, mean-pooled bags; it must beat the mean.
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                              "examples", "pytorch", "train_csv.py")
        r = subprocess.run([sys.executable, "-B", script, "--servers=" + self.servers.cluster,
                            "--generate", "--epochs=2", "--table_prefix=csv_test"],
                           capture_output=True, text=True, timeout=240)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        report = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertTrue(report["generated"])
        self.assertLess(report["test_rmse"], 0.85 * report["mean_only_rmse"], r.stdout)

    def test_bad_inputs_raise_clear_errors(self):
        ebc = tt.EmbeddingBagCollection(self.client, [tt.TableConfig("errors", DIM, ["a"])])
        keys = torch.tensor([1, 2, 3])
        with self.assertRaisesRegex(TypeError, "values: expected an integer tensor"):
            tt.Bags(torch.tensor([1.0, 2.0]), lengths=torch.tensor([2]))
        with self.assertRaisesRegex(ValueError, "values: expected a 1-D"):
            tt.Bags(torch.zeros(2, 2, dtype=torch.int64), lengths=torch.tensor([4]))
        with self.assertRaisesRegex(ValueError, "exactly one of offsets= and lengths="):
            tt.Bags(keys, offsets=torch.tensor([0]), lengths=torch.tensor([3]))
        with self.assertRaisesRegex(ValueError, "lengths: sum 2 != 3 values"):
            tt.Bags(keys, lengths=torch.tensor([1, 1]))
        with self.assertRaisesRegex(ValueError, "offsets: must start at 0"):
            tt.Bags(keys, offsets=torch.tensor([1, 2]))
        with self.assertRaisesRegex(ValueError, r"weights: expected shape \(3,\)"):
            tt.Bags(keys, lengths=torch.tensor([3]), weights=torch.ones(2))
        with self.assertRaisesRegex(TypeError, "weights: expected a floating-point"):
            tt.Bags(keys, lengths=torch.tensor([3]), weights=torch.ones(3, dtype=torch.int64))
        with self.assertRaisesRegex(ValueError, "feature 'z' is in no table"):
            ebc({"z": tt.Bags(keys, lengths=torch.tensor([3]))})
        with self.assertRaisesRegex(TypeError, "expected tessera.torch.Bags"):
            ebc({"a": keys})
        with self.assertRaisesRegex(ValueError, "negative key -2"):
            ebc({"a": tt.Bags(torch.tensor([1, -2]), lengths=torch.tensor([2]))})
        with self.assertRaisesRegex(ValueError, "is on meta; this module is on cpu"):
            ebc({"a": tt.Bags(torch.tensor([1, 2], device="meta"),
                              offsets=torch.tensor([0]))})
        with self.assertRaisesRegex(ValueError, "pooling: expected one of"):
            tt.TableConfig("x", 4, pooling="max")
        # A table of another width on the servers: the servers' AlreadyExistsError.
        with self.assertRaises(tessera.AlreadyExistsError):
            tt.EmbeddingBagCollection(self.client, [tt.TableConfig("errors", DIM + 1, ["a"])])
        # The module still works after all of that.
        out = ebc({"a": tt.Bags(keys, lengths=torch.tensor([1, 2]))})["a"]
        self.assertEqual(tuple(out.shape), (2, DIM))


def bmm_interaction(dense, sparse):
    """The torch expression dot_interaction replaces (train_dlrm.py's before it)."""
    n = sparse.shape[1] + 1
    li, lj = torch.tril_indices(n, n, offset=-1)
    t = torch.cat([dense[:, None, :], sparse], 1)
    return torch.cat([dense, torch.bmm(t, t.transpose(1, 2))[:, li, lj]], 1)


@unittest.skipIf(torch is None, "torch is not installed (Debian: python3-torch)")
class DotInteractionTest(unittest.TestCase):
    """tessera.torch.dot_interaction (python/interaction.cc) against the bmm expression: no
    server needed."""

    def check(self, batch, fields, dim, seed):
        g = torch.Generator().manual_seed(seed)
        dense = torch.randn(batch, dim, generator=g, dtype=torch.float64)
        sparse = torch.randn(batch, fields, dim, generator=g, dtype=torch.float64)
        n = fields + 1
        grad = torch.randn(batch, dim + n * (n - 1) // 2, generator=g, dtype=torch.float64)
        # The reference in float64; the kernel in float32 within 1e-5 (relative to the scale
        # of a dot of `dim` unit normals).
        d64, s64 = dense.clone().requires_grad_(), sparse.clone().requires_grad_()
        want = bmm_interaction(d64, s64)
        (want * grad).sum().backward()
        d32 = dense.float().requires_grad_()
        s32 = sparse.float().requires_grad_()
        got = tt.dot_interaction(d32, s32)
        self.assertEqual(got.dtype, torch.float32)
        self.assertEqual(tuple(got.shape), tuple(want.shape))
        (got * grad.float()).sum().backward()
        scale = max(1.0, float(dim))
        tol = TOL * scale * max(1.0, float(n))
        np.testing.assert_allclose(got.detach().double().numpy(), want.detach().numpy(),
                                   atol=tol, rtol=0)
        np.testing.assert_allclose(d32.grad.double().numpy(), d64.grad.numpy(), atol=tol,
                                   rtol=0)
        np.testing.assert_allclose(s32.grad.double().numpy(), s64.grad.numpy(), atol=tol,
                                   rtol=0)

    def test_forward_and_backward_equal_bmm(self):
        for batch, fields, dim in ((1, 1, 1), (3, 2, 3), (64, 26, 8), (17, 5, 16), (0, 4, 8)):
            with self.subTest(batch=batch, fields=fields, dim=dim):
                self.check(batch, fields, dim, seed=batch * 100 + fields)

    def test_inputs_that_need_a_copy_and_the_torch_path(self):
        g = torch.Generator().manual_seed(5)
        dense = torch.randn(8, 6, generator=g)
        sparse = torch.randn(8, 6, 3, generator=g).transpose(1, 2)  # (8, 3, 6), strided
        self.assertFalse(sparse.is_contiguous())
        torch.testing.assert_close(tt.dot_interaction(dense, sparse),
                                   bmm_interaction(dense, sparse), atol=1e-5, rtol=0)
        # float64 takes the torch expression (as CUDA tensors do): same values.
        torch.testing.assert_close(tt.dot_interaction(dense.double(), sparse.double()),
                                   bmm_interaction(dense.double(), sparse.double()))

    def test_trains_like_bmm(self):
        # A few SGD steps of a tiny model through each: the same parameters after them.
        def run(interaction):
            torch.manual_seed(3)
            lin = torch.nn.Linear(4, 4)
            emb = torch.nn.Parameter(torch.randn(16, 3, 4) * 0.3)
            top = torch.nn.Linear(4 + 6, 1)
            opt = torch.optim.SGD(list(lin.parameters()) + [emb] + list(top.parameters()),
                                  lr=0.05)
            x = torch.randn(16, 4)
            for _ in range(5):
                opt.zero_grad()
                top(interaction(lin(x), emb)).square().sum().backward()
                opt.step()
            return [p.detach().clone() for p in (lin.weight, emb, top.weight)]
        for a, b in zip(run(tt.dot_interaction), run(bmm_interaction)):
            torch.testing.assert_close(a, b, atol=TOL, rtol=0)

    def test_bad_inputs_raise_clear_errors(self):
        with self.assertRaisesRegex(ValueError, r"expected dense \(B, d\) and sparse \(B, F, d\)"):
            tt.dot_interaction(torch.zeros(4, 8), torch.zeros(4, 3, 7))
        with self.assertRaisesRegex(ValueError, r"expected dense \(B, d\)"):
            tt.dot_interaction(torch.zeros(4, 8), torch.zeros(5, 3, 8))
        with self.assertRaisesRegex(ValueError, "differ in device or dtype"):
            tt.dot_interaction(torch.zeros(4, 8), torch.zeros(4, 3, 8, dtype=torch.float64))
        with self.assertRaisesRegex(ValueError, "differ in device or dtype"):
            tt.dot_interaction(torch.zeros(4, 8), torch.zeros(4, 3, 8, device="meta"))
        with self.assertRaisesRegex(TypeError, "expected torch tensors"):
            tt.dot_interaction(np.zeros((4, 8), np.float32), torch.zeros(4, 3, 8))
        # The compiled core reads and writes in place: it converts nothing.
        core = tessera._tessera
        d, sp = np.zeros((4, 8), np.float32), np.zeros((4, 3, 8), np.float32)
        with self.assertRaisesRegex(TypeError, "dense: expected a C-contiguous float32"):
            core.dot_interaction(d.astype(np.float64), sp, np.zeros((4, 14), np.float32))
        with self.assertRaisesRegex(TypeError, "sparse: expected a C-contiguous float32"):
            core.dot_interaction(d, sp.transpose(0, 2, 1).copy().transpose(0, 2, 1),
                                 np.zeros((4, 14), np.float32))
        with self.assertRaisesRegex(ValueError, r"out: expected shape \(4, 14\)"):
            core.dot_interaction(d, sp, np.zeros((4, 13), np.float32))
        with self.assertRaisesRegex(ValueError, "out: is read-only"):
            ro = np.zeros((4, 14), np.float32)
            ro.flags.writeable = False
            core.dot_interaction(d, sp, ro)
        with self.assertRaisesRegex(ValueError, r"grad_sparse: expected the shape of sparse"):
            core.dot_interaction_backward(np.zeros((4, 14), np.float32), d, sp,
                                          np.zeros((4, 8), np.float32),
                                          np.zeros((4, 2, 8), np.float32))


if __name__ == "__main__":
    unittest.main()
