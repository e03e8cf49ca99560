"""The `tessera` package as pip installed it (run by tests/install/pip_install_test.sh with a
venv's interpreter, from outside the tree, without PYTHONPATH).

Checks that `import tessera` finds the installed package (in this interpreter's prefix, not the
checkout or a build tree), that it holds the compiled core, the stubs and py.typed and carries the
project's version, then creates a sparse and a dense table on real tessera-server processes on
127.0.0.1 (python/tests/test_client.py's LocalCluster; TESSERA_SERVER names the binary), pushes,
pulls and checks the values.

Usage: pip_check.py SOURCE_DIR VERSION
"""

import glob
import importlib.metadata
import os
import sys

import numpy as np

import tessera


def check_installed(version):
    pkg = os.path.dirname(os.path.abspath(tessera.__file__))
    prefix = os.path.realpath(sys.prefix)
    if not os.path.realpath(pkg).startswith(prefix + os.sep):
        sys.exit("pip_check: tessera imported from %s, not from this venv (%s)" % (pkg, prefix))
    core = os.path.abspath(tessera._tessera.__file__)
    if os.path.dirname(core) != pkg or not glob.glob(os.path.join(pkg, "_tessera*.so")):
        sys.exit("pip_check: the compiled core is %s, not a _tessera*.so in %s" % (core, pkg))
    for f in ("__init__.py", "_tessera.pyi", "py.typed"):
        if not os.path.isfile(os.path.join(pkg, f)):
            sys.exit("pip_check: %s is not installed in %s" % (f, pkg))
    got = importlib.metadata.version("tessera")
    if got != version:
        sys.exit("pip_check: installed version %s, the project's is %s" % (got, version))
    print("pip_check: tessera %s from %s" % (got, pkg))


def check_against_servers(src):
    sys.path.insert(0, os.path.join(src, "python", "tests"))
    sys.dont_write_bytecode = True  # nothing written into the checkout
    from test_client import LocalCluster

    cluster = LocalCluster()
    try:
        cluster.start()
        with tessera.Client(cluster.cluster) as c:
            # SGD at rate 0.5 on rows that start at 1: one push of g gives 1 - 0.5 * sum(g).
            emb = c.create_table(tessera.TableSpec.sparse(
                "pip_emb", 4, tessera.OptimizerSpec("sgd", learning_rate=0.5),
                tessera.InitializerSpec("constant", a=1.0)))
            keys = np.array([7, 1 << 40, 7, 12345], dtype=np.uint64)
            grads = np.arange(16, dtype=np.float32).reshape(4, 4) * 0.25
            c.push(emb, keys, grads)
            rows = c.pull("pip_emb", np.array([7, 1 << 40, 12345], dtype=np.uint64))
            want = 1.0 - 0.5 * np.stack([grads[0] + grads[2], grads[1], grads[3]])
            np.testing.assert_allclose(rows, want, rtol=0, atol=1e-6)
            mlp = c.create_table(tessera.TableSpec.dense(
                "pip_mlp", 10, tessera.OptimizerSpec("sgd", learning_rate=0.5)))
            c.dense_push(mlp, np.ones(10, np.float32))
            np.testing.assert_allclose(c.dense_pull(mlp), np.full(10, -0.5, np.float32))
            try:
                c.get_table("no_such_table")
                sys.exit("pip_check: get_table of a missing table did not raise")
            except tessera.NotFoundError:
                pass
    finally:
        cluster.remove()
    print("pip_check: push and pull through %d servers OK" % len(cluster.endpoints))


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: pip_check.py SOURCE_DIR VERSION")
    check_installed(sys.argv[2])
    check_against_servers(sys.argv[1])


if __name__ == "__main__":
    main()
