"""Tests of the `tessera` Python module against real tessera-server processes on 127.0.0.1.

Run by ctest (label `python`), which sets PYTHONPATH to the module's folder and TESSERA_SERVER
to the server binary. By hand:

    PYTHONPATH=build/python TESSERA_SERVER=build/tessera-server python3 python/tests/test_client.py
"""

import ctypes
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

import tessera

try:
    import torch
except ImportError:  # the torch test skips with a message
    torch = None

NUM_SERVERS = 2


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent():
    # PR_SET_PDEATHSIG = 1: a server outlives no test process, even one killed by a ctest timeout.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)



def _stop_and_wait(procs, limit_s=10.0):
    """SIGSTOPs `procs` and returns once each is stopped (state T in /proc/PID/stat): the
    signal takes effect after send_signal returns, and a server not stopped yet may still answer
    a request sent right after."""
    for p in procs:
        p.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + limit_s
    for p in procs:
        while time.monotonic() < deadline:
            with open("/proc/%d/stat" % p.pid) as f:
                stat = f.read()
            if stat[stat.rfind(")") + 2] == "T":  # the command name may hold spaces
                break
            time.sleep(0.001)


def _progress_while_waiting(state, seconds=0.5):
    """Loop iterations this thread makes in `seconds` while another thread is inside a call
    that waits (state["inside"] and not state["done"]): many only if that call released the
    GIL."""
    progress = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if state["inside"] and not state["done"]:
            progress += 1
    return progress

class LocalCluster:
    """NUM_SERVERS tessera-server processes with RocksDB data dirs and an admin root in a temp dir."""

    def __init__(self, extra_flags=()):
        self.extra_flags = list(extra_flags)
        self.binary = os.environ.get("TESSERA_SERVER")
        if not self.binary or not os.access(self.binary, os.X_OK):
            raise RuntimeError("TESSERA_SERVER must name the tessera-server binary, got %r" %
                               self.binary)
        self.dir = tempfile.mkdtemp(prefix="tessera-py-")
        self.admin_root = os.path.join(self.dir, "admin")
        os.makedirs(self.admin_root)
        self.procs = []
        self.endpoints = []

    def start(self):
        for attempt in range(3):
            self.endpoints = ["127.0.0.1:%d" % free_port() for _ in range(NUM_SERVERS)]
            try:
                for rank in range(NUM_SERVERS):
                    self._spawn(rank)
                return
            except RuntimeError:
                self.stop()
                if attempt == 2:
                    raise

    def _spawn(self, rank):
        log = open(os.path.join(self.dir, "server%d.log" % rank), "ab")
        args = [self.binary, "--cluster=" + ",".join("tcp://" + e for e in self.endpoints),
                "--rank=%d" % rank, "--lanes=2",
                "--data_dir=" + os.path.join(self.dir, "data%d" % rank),
                "--admin_root=" + self.admin_root] + self.extra_flags
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log,
                             preexec_fn=die_with_parent)
        log.close()
        self.procs.append(p)
        seen = b""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready, _, _ = select.select([p.stdout], [], [], 0.1)
            if ready:
                chunk = os.read(p.stdout.fileno(), 4096)
                if not chunk:
                    break  # the server exited
                seen += chunk
                if b"tessera-server ready" in seen:
                    return
            if p.poll() is not None:
                break
        raise RuntimeError("server %d did not start; see %s" % (rank, self.dir))

    @property
    def cluster(self):
        return ",".join(self.endpoints)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()
        self.procs = []

    def remove(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.servers = LocalCluster()
        # Registered before start: the servers die also when starting or a test fails.
        cls.addClassCleanup(cls.servers.remove)
        cls.servers.start()
        cls.client = tessera.Client(cls.servers.cluster, admin_root=cls.servers.admin_root)
        cls.addClassCleanup(cls.client.close)

    def sparse(self, name, dim, optimizer, initializer=None):
        spec = tessera.TableSpec.sparse(name, dim, optimizer,
                                        initializer or tessera.InitializerSpec())
        return self.client.create_table(spec)

    # ------------------------------------------------------------ values

    def test_sgd_push_pull_with_duplicate_keys(self):
        t = self.sparse("sgd", 4, tessera.OptimizerSpec("sgd", learning_rate=0.5))
        self.assertEqual((t.name, t.dim, t.kind), ("sgd", 4, tessera.TableKind.SPARSE))
        keys = np.array([1, 2, 1, 1 << 63], dtype=np.uint64)
        np.testing.assert_array_equal(self.client.pull(t, keys), np.zeros((4, 4), np.float32))
        grads = np.arange(16, dtype=np.float32).reshape(4, 4)
        self.client.push(t, keys, grads)
        # Duplicate keys' gradients are summed, then one SGD step: w = -lr * sum(g).
        want = {1: -0.5 * (grads[0] + grads[2]), 2: -0.5 * grads[1], 1 << 63: -0.5 * grads[3]}
        got = self.client.pull(t, np.array([1 << 63, 2, 1], dtype=np.uint64))
        np.testing.assert_allclose(got, np.stack([want[1 << 63], want[2], want[1]]), rtol=1e-6)
        # Any table argument may be the name; list keys convert.
        np.testing.assert_allclose(self.client.pull("sgd", [2]), want[2][None], rtol=1e-6)

    def test_adagrad_matches_formula(self):
        lr, acc0, w0 = 0.1, 0.1, 0.5
        opt = tessera.OptimizerSpec("adagrad", learning_rate=lr, initial_accumulator=acc0)
        t = self.sparse("adagrad", 3, opt, tessera.InitializerSpec("constant", a=w0))
        keys = np.array([10, 11], dtype=np.uint64)
        w = np.full((2, 3), w0, np.float64)
        a = np.full((2, 3), acc0, np.float64)
        rng = np.random.default_rng(1)
        for _ in range(3):
            g = rng.normal(size=(2, 3)).astype(np.float32)
            self.client.push(t, keys, g)
            a += g.astype(np.float64) ** 2
            w -= lr * g / (np.sqrt(a) + 1e-8)  # ps/optimizer.cc, Adagrad
        np.testing.assert_allclose(self.client.pull(t, keys), w, rtol=1e-5, atol=1e-6)

    def test_drop_table_and_create_again_empty(self):
        sgd = tessera.OptimizerSpec("sgd", learning_rate=1.0)
        t = self.sparse("dropme", 2, sgd)
        self.client.push(t, [3, 4], -np.ones((2, 2), np.float32))
        np.testing.assert_array_equal(self.client.pull(t, [3, 4]), np.ones((2, 2), np.float32))
        self.client.drop_table("dropme")
        with self.assertRaises(tessera.NotFoundError):
            self.client.get_table("dropme")
        self.client.drop_table("dropme")  # again: no error
        t = self.sparse("dropme", 3, sgd)  # another dim: the old layout went with the rows
        np.testing.assert_array_equal(self.client.pull(t, [3, 4]), np.zeros((2, 3), np.float32))

    def test_push_pull_returns_values_after_push(self):
        t = self.sparse("pushpull", 2, tessera.OptimizerSpec("sgd", learning_rate=1.0))
        got = self.client.push_pull(t, [5, 6], np.ones((2, 2), np.float32))
        np.testing.assert_array_equal(got, -np.ones((2, 2), np.float32))

    def test_pull_out_writes_in_place(self):
        t = self.sparse("outs", 4, tessera.OptimizerSpec("sgd", learning_rate=1.0),
                        tessera.InitializerSpec("constant", a=2.5))
        keys = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.uint64)
        out = np.full((2, 3, 4), np.nan, np.float32)
        address = out.ctypes.data
        res = self.client.pull(t, keys, out=out)
        self.assertIs(res, out)
        self.assertEqual(out.ctypes.data, address)
        np.testing.assert_array_equal(out, np.full((2, 3, 4), 2.5, np.float32))
        # Flat and (rows, dim) outputs are accepted too; a view writes into its base.
        base = np.zeros((10, 4), np.float32)
        self.client.pull(t, keys, out=base[2:8])
        np.testing.assert_array_equal(base[2:8], 2.5)
        np.testing.assert_array_equal(base[:2], 0)
        flat = np.zeros(24, np.float32)
        self.client.pull(t, keys, out=flat)
        np.testing.assert_array_equal(flat, 2.5)
        # Without out=, the result has the keys' shape plus the row.
        self.assertEqual(self.client.pull(t, keys).shape, (2, 3, 4))

    def test_async_pull_and_push(self):
        t = self.sparse("async", 2, tessera.OptimizerSpec("sgd", learning_rate=1.0))
        self.client.push_async(t, [7], np.full((1, 2), 3.0, np.float32)).wait()
        out = np.zeros((1, 2), np.float32)
        fut = self.client.pull_async(t, np.array([7], np.uint64), out=out)
        self.assertIs(fut.wait(timeout_ms=10000), out)
        self.assertTrue(fut.done())
        np.testing.assert_array_equal(out, [[-3.0, -3.0]])
        # Dropping an unfinished future cancels it; the array stays usable.
        self.client.pull_async(t, [7] * 1000)
        np.testing.assert_array_equal(self.client.pull(t, [7]), [[-3.0, -3.0]])

    def test_converted_inputs(self):
        t = self.sparse("convert", 2, tessera.OptimizerSpec("sgd", learning_rate=1.0))
        keys = np.array([1, 0, 2, 0, 3, 0], dtype=np.int64)[::2]  # strided, signed: converted once
        grads = np.asfortranarray(np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float64))
        self.client.push(t, keys, grads)
        np.testing.assert_array_equal(self.client.pull(t, [1, 2, 3]), -grads)

    # ------------------------------------------------------------ errors

    def test_argument_errors(self):
        t = self.sparse("errors", 4, tessera.OptimizerSpec("sgd"))
        keys = np.array([1, 2], np.uint64)
        with self.assertRaisesRegex(TypeError, "keys: expected an integer array.*float"):
            self.client.pull(t, np.array([1.0, 2.0]))
        with self.assertRaisesRegex(ValueError, "negative keys"):
            self.client.pull(t, np.array([1, -2]))
        with self.assertRaisesRegex(ValueError, "scalar"):
            self.client.pull(t, np.uint64(3))
        with self.assertRaisesRegex(TypeError, "grads: expected a float32 array, got dtype int64"):
            self.client.push(t, keys, np.ones((2, 4), np.int64))
        with self.assertRaisesRegex(ValueError, r"grads: expected shape \(2, 4\).*got \(2, 3\)"):
            self.client.push(t, keys, np.ones((2, 3), np.float32))
        with self.assertRaisesRegex(ValueError, r"got \(3, 4\)"):
            self.client.push(t, keys, np.ones((3, 4), np.float32))
        with self.assertRaisesRegex(TypeError, "out: expected dtype float32.*float64"):
            self.client.pull(t, keys, out=np.zeros((2, 4)))
        with self.assertRaisesRegex(ValueError, "out: must be C-contiguous"):
            self.client.pull(t, keys, out=np.zeros((4, 2), np.float32).T)
        ro = np.zeros((2, 4), np.float32)
        ro.setflags(write=False)
        with self.assertRaisesRegex(ValueError, "read-only"):
            self.client.pull(t, keys, out=ro)
        with self.assertRaisesRegex(TypeError, "written in place"):
            self.client.pull(t, keys, out=[0.0] * 8)
        with self.assertRaisesRegex(ValueError, r"out: expected shape"):
            self.client.pull(t, keys, out=np.zeros((2, 5), np.float32))

    def test_status_errors(self):
        with self.assertRaises(tessera.NotFoundError) as e:
            self.client.pull("no_such_table", [1])
        self.assertIsInstance(e.exception, tessera.Error)
        self.assertIsInstance(e.exception, LookupError)
        self.assertEqual(e.exception.code, "NotFound")
        self.assertIn("no_such_table", str(e.exception))
        self.sparse("twice", 4, tessera.OptimizerSpec("sgd"))
        with self.assertRaisesRegex(tessera.AlreadyExistsError, "dim: 4 vs 8"):
            self.sparse("twice", 8, tessera.OptimizerSpec("sgd"))
        d = self.client.create_table(tessera.TableSpec.dense("dense_not_sparse", 4))
        with self.assertRaisesRegex(tessera.InvalidArgumentError, "not a sparse table"):
            self.client.pull(d, [1])
        with self.assertRaises(ValueError):  # InvalidArgumentError is a ValueError too
            self.client.dense_pull(d, offset=2, length=5)
        with self.assertRaises(tessera.InvalidArgumentError):
            self.client.create_table(tessera.TableSpec.sparse("", 4))
        with self.assertRaisesRegex(ValueError, "optimizer kind 'adamw'"):
            tessera.OptimizerSpec("adamw")

    def test_unreachable_server_raises(self):
        with self.assertRaises(tessera.UnavailableError):
            tessera.Client("127.0.0.1:%d" % free_port(), connect_timeout_ms=300)

    def test_closed_client_raises(self):
        c = tessera.Client(self.servers.cluster)
        self.assertEqual(c.num_servers, NUM_SERVERS)
        c.close()
        self.assertTrue(c.closed)
        with self.assertRaisesRegex(tessera.FailedPreconditionError, "closed"):
            c.pull("sgd", [1])

    # ------------------------------------------------------------ dense, clocks, meta

    def test_dense(self):
        t = self.client.create_table(tessera.TableSpec.dense(
            "dense", 10, tessera.OptimizerSpec("sgd", learning_rate=1.0),
            tessera.InitializerSpec("constant", a=1.0)))
        self.assertEqual(t.length, 10)
        np.testing.assert_array_equal(self.client.dense_pull(t), np.ones(10, np.float32))
        self.client.dense_push(t, np.arange(8, dtype=np.float32), offset=2)
        want = np.ones(10, np.float32)
        want[2:] -= np.arange(8)
        np.testing.assert_array_equal(self.client.dense_pull(t), want)
        out = np.zeros((2, 2), np.float32)
        self.assertIs(self.client.dense_pull(t, offset=3, length=4, out=out), out)
        np.testing.assert_array_equal(out.ravel(), want[3:7])

    def test_learning_rate_scale(self):
        t = self.client.create_table(tessera.TableSpec.dense(
            "scaled", 4, tessera.OptimizerSpec("sgd", learning_rate=1.0)))
        self.assertEqual(self.client.learning_rate_scale, 1.0)
        self.client.set_learning_rate_scale(0.5)
        self.client.dense_push(t, np.full(4, -2.0, np.float32))
        self.client.set_learning_rate_scale(1.0)
        np.testing.assert_array_equal(self.client.dense_pull(t), np.ones(4, np.float32))
        with self.assertRaises(tessera.InvalidArgumentError):
            self.client.set_learning_rate_scale(-1.0)

    def test_clock_meta_stats(self):
        c = tessera.Client(self.servers.cluster, worker_id=0, num_workers=1)
        self.assertEqual(c.clock(), 1)
        self.assertEqual(c.clock(), 2)
        c.set_clock(10)
        self.assertEqual(c.current_clock, 10)
        c.put_meta("py/meta", b"\x00value")
        self.assertEqual(c.get_meta("py/meta"), b"\x00value")
        self.assertIsNone(c.get_meta("py/absent"))
        stats = c.server_stats(1)
        self.assertIsInstance(stats, dict)
        self.assertTrue(stats)
        c.close()

    def test_barrier_releases_gil(self):
        w0 = tessera.Client(self.servers.cluster, worker_id=0, num_workers=2)
        w1 = tessera.Client(self.servers.cluster, worker_id=1, num_workers=2)
        state = {"inside": False, "done": False, "error": None}

        def worker0():
            state["inside"] = True
            try:
                w0.barrier("gil", timeout_ms=5000)
            except Exception as e:  # reported below
                state["error"] = e
            state["done"] = True

        th = threading.Thread(target=worker0)
        th.start()
        # This thread must run while worker 0 waits in the barrier: only if the GIL is released.
        progress = _progress_while_waiting(state)
        self.assertGreater(progress, 1000, "no Python progress while barrier() was waiting")
        self.assertFalse(state["done"])
        w1.barrier("gil", timeout_ms=5000)
        th.join()
        self.assertIsNone(state["error"])
        w0.close()
        w1.close()

    def test_pull_waits_release_gil(self):
        # pull() and Future.wait() on servers that are stopped (SIGSTOP): another Python thread
        # must run meanwhile (tessera.torch waits on its pulls and pushes this way while a
        # DataLoader thread or the autograd engine needs the GIL). Both calls finish once the
        # servers resume, within a generous deadline.
        t = self.sparse("gil_pull", 4, tessera.OptimizerSpec("sgd"))
        keys = np.arange(1, 65, dtype=np.uint64)
        self.client.pull(t, keys)  # connected and routed before the servers stop
        for how in ("pull", "future"):
            with self.subTest(how=how):
                state = {"inside": False, "done": False, "error": None, "rows": None}

                def waiter():
                    state["inside"] = True
                    try:
                        if how == "pull":
                            state["rows"] = self.client.pull(t, keys, timeout_ms=30000)
                        else:
                            f = self.client.pull_async(t, keys)
                            state["rows"] = f.wait(timeout_ms=30000)
                    except Exception as e:  # reported below
                        state["error"] = e
                    state["done"] = True

                _stop_and_wait(self.servers.procs)
                th = threading.Thread(target=waiter)
                try:
                    th.start()
                    progress = _progress_while_waiting(state)
                    self.assertGreater(progress, 1000,
                                       "no Python progress while %s waited" % how)
                    self.assertFalse(state["done"], "the %s finished on stopped servers" % how)
                finally:
                    for p in self.servers.procs:
                        p.send_signal(signal.SIGCONT)
                th.join(timeout=60)
                self.assertFalse(th.is_alive(), "the %s did not finish after SIGCONT" % how)
                self.assertIsNone(state["error"])
                self.assertEqual(state["rows"].shape, (64, 4))

    # ------------------------------------------------------------ checkpoint and export

    def test_checkpoint_restore_and_export_reader(self):
        t = self.sparse("ckpt", 2, tessera.OptimizerSpec("sgd", learning_rate=1.0))
        d = self.client.create_table(tessera.TableSpec.dense(
            "ckpt_dense", 3, tessera.OptimizerSpec("sgd", learning_rate=1.0)))
        keys = np.arange(1, 21, dtype=np.uint64)
        self.client.push(t, keys, np.ones((20, 2), np.float32))
        self.client.dense_push(d, np.array([1, 2, 3], np.float32))
        self.assertIsInstance(self.client.checkpoint("py-ckpt"), int)
        self.client.push(t, keys, np.ones((20, 2), np.float32))
        self.client.restore("py-ckpt")
        np.testing.assert_array_equal(self.client.pull(t, keys), -np.ones((20, 2), np.float32))

        version = self.client.export("py-export")
        self.assertEqual(version, 1)
        root = os.path.join(self.servers.admin_root, "py-export")
        self.assertEqual(tessera.latest_export_version(root), 1)
        reader = tessera.ExportReader(root)
        self.assertEqual(reader.version, 1)
        self.assertIn("ckpt", reader.tables())
        self.assertEqual(reader.spec("ckpt").dim, 2)
        self.assertEqual(reader.row_count("ckpt"), 20)
        out = np.zeros((21, 2), np.float32)
        self.assertIs(reader.lookup("ckpt", np.arange(1, 22, dtype=np.uint64), out=out), out)
        np.testing.assert_array_equal(out[:20], self.client.pull(t, keys))
        np.testing.assert_array_equal(out[20], [0, 0])  # no row: the initializer's value
        np.testing.assert_array_equal(reader.dense_read("ckpt_dense"), [-1, -2, -3])
        np.testing.assert_array_equal(reader.dense_read("ckpt_dense", offset=1, length=1), [-2])
        with self.assertRaises(tessera.NotFoundError):
            reader.lookup("absent", [1])
        with self.assertRaises(tessera.Error):
            tessera.ExportReader(os.path.join(self.servers.admin_root, "no-export"))

    # ------------------------------------------------------------ torch

    @unittest.skipIf(torch is None, "torch is not importable (Debian: python3-torch)")
    def test_torch_tensors_without_copies(self):
        t = self.sparse("torch", 4, tessera.OptimizerSpec("sgd", learning_rate=1.0))
        keys = torch.tensor([3, 4, 5])  # int64: converted once; rows are not
        grads = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        self.client.push(t, keys, grads)
        out = torch.full((3, 4), float("nan"))
        self.client.pull(t, keys, out=out)  # written into the tensor's own memory
        torch.testing.assert_close(out, -grads)
        # numpy views of tensors share memory both ways.
        view = out.numpy()
        self.client.pull(t, keys[:1], out=view[1:2])
        torch.testing.assert_close(out[1], -grads[0])
        with self.assertRaisesRegex(ValueError, "C-contiguous"):
            self.client.pull(t, keys, out=torch.zeros(4, 3).t())
        with self.assertRaisesRegex(TypeError, "float32"):
            self.client.pull(t, keys, out=torch.zeros(3, 4, dtype=torch.float64))


class Etcd:
    """A real etcd process (Debian etcd-server) on free loopback ports, data in a temp dir."""

    def __init__(self, binary):
        self.dir = tempfile.mkdtemp(prefix="tessera-py-etcd-")
        self.port = free_port()
        peer = "http://127.0.0.1:%d" % free_port()
        client = "http://127.0.0.1:%d" % self.port
        log = open(os.path.join(self.dir, "etcd.log"), "ab")
        self.proc = subprocess.Popen(
            [binary, "--name=t", "--data-dir=" + os.path.join(self.dir, "data"),
             "--listen-client-urls=" + client, "--advertise-client-urls=" + client,
             "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
             "--initial-cluster=t=" + peer],
            stdout=log, stderr=log, preexec_fn=die_with_parent)
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("etcd exited at start; see %s" % self.dir)
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as c:
                    c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    if b'"health":"true"' in c.recv(4096):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("etcd did not answer within 60 s; see %s" % self.dir)

    def url(self, prefix):
        return "etcd://127.0.0.1:%d/%s" % (self.port, prefix)

    def remove(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class CurveTest(unittest.TestCase):
    """CurveZMQ from Python: curve_server_key, and curve_client_secret_key for admin rights."""

    def test_admin_key_may_checkpoint_and_a_fresh_key_may_not(self):
        ctl = os.environ.get("TESSERA_CTL")
        if not ctl or not os.access(ctl, os.X_OK):
            raise RuntimeError("TESSERA_CTL must name the tessera-ctl binary, got %r" % ctl)
        keys = tempfile.mkdtemp(prefix="tessera-py-keys-")
        self.addCleanup(shutil.rmtree, keys, True)
        for name in ("server", "admin"):
            out = subprocess.run([ctl, "keygen", keys, "--key_name=" + name],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
            if out.returncode != 0 and b"CurveZMQ" in out.stdout:
                self.skipTest("libzmq without CurveZMQ: " + out.stdout.decode())
            self.assertEqual(out.returncode, 0, out.stdout.decode())

        def read(name):
            with open(os.path.join(keys, name)) as f:
                return f.read().split()[0]

        servers = LocalCluster(extra_flags=[
            "--curve_secret_key_file=" + os.path.join(keys, "server.key"),
            "--admin_clients=" + os.path.join(keys, "admin.pub")])
        self.addCleanup(servers.remove)
        servers.start()
        common = dict(curve_server_key=read("server.pub"), admin_root=servers.admin_root)
        with tessera.Client(servers.cluster, **common) as worker:
            t = worker.create_table(tessera.TableSpec.sparse(
                "curve", 4, tessera.OptimizerSpec("sgd", learning_rate=1.0),
                tessera.InitializerSpec()))
            keys_ = np.arange(1, 101, dtype=np.uint64)
            worker.push(t, keys_, np.ones((100, 4), dtype=np.float32))
            with self.assertRaises(tessera.PermissionDeniedError) as e:
                worker.checkpoint("ckpt-worker")
            self.assertIn("admin", str(e.exception))
        with tessera.Client(servers.cluster, curve_client_secret_key=read("admin.key"),
                            **common) as admin:
            admin.checkpoint("ckpt-admin")
            t = admin.get_table("curve")
            np.testing.assert_array_equal(admin.pull(t, np.arange(1, 101, dtype=np.uint64)),
                                          -np.ones((100, 4), dtype=np.float32))
        self.assertTrue(os.path.exists(os.path.join(servers.admin_root, "ckpt-admin")))
        # (The client made its own directory for the marker before asking; no server wrote.)
        self.assertEqual(os.listdir(os.path.join(servers.admin_root, "ckpt-worker")), [])


class CoordinatorTest(unittest.TestCase):
    """Client("etcd://HOST:PORT/PREFIX"): the cluster map in etcd names the servers."""

    def test_client_follows_the_cluster_map_in_etcd(self):
        etcd_binary = os.environ.get("TESSERA_ETCD", "/usr/bin/etcd")
        ctl = os.environ.get("TESSERA_CTL")
        if not os.access(etcd_binary, os.X_OK):
            self.skipTest("no etcd at %s (Debian: apt-get install etcd-server)" % etcd_binary)
        if not ctl or not os.access(ctl, os.X_OK):
            raise RuntimeError("TESSERA_CTL must name the tessera-ctl binary, got %r" % ctl)
        etcd = Etcd(etcd_binary)
        self.addCleanup(etcd.remove)
        url = etcd.url("pyjob")
        servers = LocalCluster(extra_flags=["--coordinator=" + url])
        self.addCleanup(servers.remove)
        servers.start()
        with self.assertRaisesRegex(Exception, "tessera-ctl map init"):
            tessera.Client(url, connect_timeout_ms=5000)
        with self.assertRaisesRegex(Exception, "etcd://HOST:PORT/PREFIX"):
            tessera.Client("etcd://127.0.0.1")
        endpoints = ",".join("tcp://" + e for e in servers.endpoints)
        out = subprocess.run([ctl, "map", "init", "--coordinator=" + url, "--servers=" + endpoints],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout.decode())
        with tessera.Client(url) as client:
            self.assertEqual(client.cluster_map_version, 1)
            self.assertEqual(client.servers, ["tcp://" + e for e in servers.endpoints])
            t = client.create_table(tessera.TableSpec.sparse(
                "coord", 4, tessera.OptimizerSpec("sgd", learning_rate=1.0),
                tessera.InitializerSpec()))
            keys = np.arange(1, 2001, dtype=np.uint64)
            grads = np.arange(8000, dtype=np.float32).reshape(2000, 4) / 100
            # The servers may still be at version 0 here (they look for a first map every
            # 500 ms): their refusals are sent again until they catch up.
            client.push(t, keys, grads)
            np.testing.assert_array_equal(client.pull(t, keys), -grads)
            # Once they serve by version 1, nothing is refused.
            retries = client.stale_map_retries
            client.push(t, keys, grads)
            np.testing.assert_array_equal(client.pull(t, keys), -2 * grads)
            self.assertEqual(client.stale_map_retries, retries)


if __name__ == "__main__":
    unittest.main()
