"""bench_python: the DLRM trained through tessera.torch against the C++ tessera-worker and
against the NumPy-level PyTorch example it replaced, same data, model and threads.

Three trainers, each against its own fresh tessera-server (RocksDB data dir in a temp dir) on
a free 127.0.0.1 port, and the dense part alone (two ways), run one after the other in rounds
(A B C D E, A B C D E, ...):
- torch_module:  examples/pytorch/train_dlrm.py (tessera.torch, PrefetchLoader; data generated
                 by one DataLoader worker process);
- cpp_worker:    worker/tessera-worker (--threads=1 --data_threads=1, no validation rounds);
- numpy_example: benchmarks/pytorch_numpy_dlrm.py (the example before tessera.torch, kept as
                 it was: pulls into NumPy arrays, bags scattered by hand, gradients pushed from
                 e.grad, data generated on a Python thread);
- torch_dense_only: benchmarks/torch_dense_step.py, the model's dense part alone in torch
                 (forward, backward, Adam on one fixed batch; no server, no data): the ceiling
                 of a torch trainer of this model here whose pairwise dots are torch.bmm;
- torch_dense_fused: the same with the pairwise dots by tessera.torch.dot_interaction, as
                 train_dlrm.py computes them: the ceiling of torch_module.
All train the same model (batch 1024, 26 fields of width 8, MLPs 13-64-8 and 359-64-1, wide
part, one pass over --train_samples, max cardinality 20000), flags spelled out below. Each
reports training samples/s of its one worker (wall time of the training loop, data generated
on the fly: synthetic_data.py in the Python trainers, the C++ worker's generator on its data
thread). The ratios are medians of the per-round ratios; the last line is one JSON object with
`torch_module_vs_cpp_worker`, `torch_module_vs_numpy_example` and the ceilings
`torch_dense_only_vs_cpp_worker` and `torch_dense_fused_vs_cpp_worker`.

    python3 benchmarks/bench_python.py [--build=build] [--train_samples=200000] [--rounds=3]
                                       [--pregenerate]
"""

import argparse
import json
import os
import resource
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(build, work):
    port = free_port()
    out = open(os.path.join(work, "server.out"), "wb")
    p = subprocess.Popen([os.path.join(build, "tessera-server"),
                          "--cluster=tcp://127.0.0.1:%d" % port, "--rank=0",
                          "--data_dir=" + os.path.join(work, "data")],
                         stdout=subprocess.PIPE, stderr=open(os.path.join(work, "server.log"),
                                                             "wb"))
    out.close()
    seen, deadline = b"", time.monotonic() + 30
    while time.monotonic() < deadline and b"tessera-server ready" not in seen:
        if select.select([p.stdout], [], [], 0.1)[0]:
            chunk = os.read(p.stdout.fileno(), 4096)
            if not chunk:
                break
            seen += chunk
    if b"tessera-server ready" not in seen:
        p.kill()
        raise RuntimeError("tessera-server did not start; see " + work)
    return p, "127.0.0.1:%d" % port


def last_json(text):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no JSON line in:\n" + text[-2000:])


def run(kind, args, python):
    work = tempfile.mkdtemp(prefix="tessera-bench-python-")
    server, endpoint = None, None
    try:
        if not kind.startswith("torch_dense"):
            server, endpoint = start_server(args.build, work)
        # The model and the data, spelled out for all three (the C++ worker's "auto" widths
        # and the Python trainers' defaults are these today; a change of either must not go
        # unnoticed here): batch 1024, embedding width 8, one pass over the training samples.
        common = ["--train_samples=%d" % args.train_samples,
                  "--test_samples=%d" % args.test_samples, "--batch_size=1024",
                  "--embedding_dim=8"]
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads),
                   OMP_NUM_THREADS=str(args.threads),
                   PYTHONPATH=os.path.join(args.build, "python"))
        if kind == "cpp_worker":
            cmd = [os.path.join(args.build, "worker", "tessera-worker"),
                   "--servers=tcp://" + endpoint, "--num_workers=1", "--threads=%d" % args.threads,
                   "--data_threads=1", "--validate_every=0", "--bottom_mlp=64", "--top_mlp=64",
                   "--epochs=1", "--synthetic_max_cardinality=20000"]
        elif kind.startswith("torch_dense"):
            cmd = [python, "-B", os.path.join(ROOT, "benchmarks", "torch_dense_step.py"),
                   "--threads=%d" % args.threads, "--steps=%d" % max(
                       args.train_samples // 1024 // 2, 20),
                   "--interaction=" + ("fused" if kind == "torch_dense_fused" else "bmm")]
        else:
            script = {"torch_module": "examples/pytorch/train_dlrm.py",
                      "numpy_example": "benchmarks/pytorch_numpy_dlrm.py"}[kind]
            cmd = [python, "-B", os.path.join(ROOT, script), "--servers=" + endpoint,
                   "--threads=%d" % args.threads, "--progress_interval_s=1e9"]
            if args.pregenerate:
                cmd.append("--pregenerate")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run(["nice", "-n", "10"] + cmd + common, cwd=work, env=env,
                           capture_output=True, text=True, timeout=1800)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the server is not reaped yet
        cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if r.returncode != 0:
            raise RuntimeError("%s failed (%d):\n%s" % (kind, r.returncode, r.stderr[-3000:]))
        j = last_json(r.stdout)
        rate = j.get("samples_per_s_worker0", j.get("samples_per_s"))
        samples = (j.get("train_samples_worker0") or j.get("train_samples") or
                   j.get("steps", 0) * j.get("batch_size", 0))
        return {"samples_per_s": float(rate), "test_auc": j.get("test_auc"),  # None: no test
                "cpu_us_per_sample": 1e6 * cpu_s / max(float(samples), 1.0)}
    finally:
        if server is not None:
            server.kill()
            server.wait()
            server.stdout.close()
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--train_samples", type=int, default=200000)
    ap.add_argument("--test_samples", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--pregenerate", action="store_true",
                    help="the Python trainers generate their training batches before their "
                         "timed loop (the C++ worker still generates on its data thread)")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)

    def skip(why):
        print("bench_python: skipped: " + why)
        print(json.dumps({"bench": "python", "skipped": True, "reason": why}))
        return 0

    for b in ("tessera-server", os.path.join("worker", "tessera-worker")):
        if not os.access(os.path.join(args.build, b), os.X_OK):
            return skip("no %s in %s (build it)" % (b, args.build))
    probe = subprocess.run([args.python, "-c", "import torch, tessera.torch"],
                           env=dict(os.environ, PYTHONPATH=os.path.join(args.build, "python")),
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return skip("%s cannot import torch and tessera.torch (Debian: python3-torch; "
                    "build tessera_python): %s" % (args.python, probe.stderr.strip()[-300:]))

    kinds = ("torch_module", "cpp_worker", "numpy_example", "torch_dense_only",
             "torch_dense_fused")
    load_start = os.getloadavg()[0]
    results = {k: [] for k in kinds}
    for rnd in range(args.rounds):
        for k in kinds:
            res = run(k, args, args.python)
            results[k].append(res)
            auc = "%.4f" % res["test_auc"] if res["test_auc"] is not None else "-"
            print("round %d %-16s %8.0f samples/s  test auc %-6s  %6.1f cpu us/sample" %
                  (rnd + 1, k, res["samples_per_s"], auc, res["cpu_us_per_sample"]), flush=True)

    def rates(k):
        return [r["samples_per_s"] for r in results[k]]

    def ratio(a, b):
        return statistics.median(x / y for x, y in zip(rates(a), rates(b)))

    out = {"bench": "python", "loadavg_start": load_start, "loadavg_end": os.getloadavg()[0],
           "pregenerate": args.pregenerate, "train_samples": args.train_samples,
           "rounds": args.rounds, "threads": args.threads, "counts": "training samples/s of one worker"}
    for k in kinds:
        out[k + "_samples_per_s"] = round(statistics.median(rates(k)))
        out[k + "_samples_per_s_rounds"] = [round(x) for x in rates(k)]
        if results[k][0]["test_auc"] is not None:
            out[k + "_test_auc"] = round(
                statistics.median(float(r["test_auc"]) for r in results[k]), 4)
        # CPU seconds of the trainer's process tree (all its threads and DataLoader workers;
        # not the server's) over the whole run, test included, per training sample: what a
        # loaded machine, where wall time follows the CPU share, charges.
        out[k + "_cpu_us_per_sample"] = round(statistics.median(
            r["cpu_us_per_sample"] for r in results[k]), 1)
    out["torch_module_vs_cpp_worker"] = round(ratio("torch_module", "cpp_worker"), 3)
    out["torch_module_vs_numpy_example"] = round(ratio("torch_module", "numpy_example"), 3)
    # The ceilings: torch's dense step alone against the C++ worker, with torch.bmm's pairwise
    # dots and with tessera.torch.dot_interaction's (the module's: no trainer of it passes that
    # on this machine and thread count), and how much of the latter the module keeps.
    out["torch_dense_only_vs_cpp_worker"] = round(ratio("torch_dense_only", "cpp_worker"), 3)
    out["torch_dense_fused_vs_cpp_worker"] = round(ratio("torch_dense_fused", "cpp_worker"), 3)
    out["torch_module_vs_torch_dense_only"] = round(ratio("torch_module", "torch_dense_only"), 3)
    out["torch_module_vs_torch_dense_fused"] = round(
        ratio("torch_module", "torch_dense_fused"), 3)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
