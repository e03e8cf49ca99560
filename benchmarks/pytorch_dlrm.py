"""The PyTorch baseline of bench_train: Tessera's click model, trained in plain PyTorch.

bench_train (benchmarks/bench_train.cc) runs this script as one of its cells, alternating with
the Tessera cells, and reads the JSON line it prints last. It can also run alone:

    /usr/bin/python3 benchmarks/pytorch_dlrm.py --train_samples=48000 --threads=1

The model is the C++ worker's (worker/model.h, worker/model.cc, worker/cpu_model_internal.h):
- deep part: one embedding bag per (sample, field) with sum pooling (torch.nn.EmbeddingBag,
  mode="sum", sparse gradients), embedding_dim wide, uniform +-0.05; a bottom MLP on the 13 dense
  features (13 -> 64 -> embedding_dim, ReLU on every layer, the output layer included); the
  pairwise dot products of the bottom output and the 26 pooled fields (27 vectors, pairs (i, j)
  with j < i in row order, as the C++ model); a top MLP on [bottom output, dots]
  (367 -> 64 -> 1 at width 16; ReLU on the hidden layers, a linear output);
- wide part: one weight per feature key (an EmbeddingBag of width 1 summed per sample, zeros);
- a global bias (zero).
nn.Linear's default initialization is the one Tessera's dense tables use (W and b uniform in
+-1/sqrt(fan_in)).

Optimizers (ModelConfig's defaults):
- embeddings: torch.optim.Adagrad, lr 0.05, initial accumulator 0.01, eps 1e-8 (sparse);
- MLPs and bias: torch.optim.Adam, lr 3e-3, betas (0.9, 0.999), eps 1e-8;
- wide weights: Tessera runs FTRL-Proximal on the server (alpha 0.05, beta 1, L1 0, L2 0.1).
  PyTorch has no FTRL; the closest built-in optimizer is sparse Adagrad with lr = alpha and an
  initial accumulator of beta^2 = 1: its per-weight step lr / sqrt(1 + sum g^2) follows FTRL's
  alpha / (beta + sqrt(sum g^2)) (equal at the first step). FTRL's L2 of 0.1 is left out (sparse
  Adagrad has no weight decay; next to FTRL's (beta + sqrt(n)) / alpha = 20 or more it shifts a
  weight by under 0.5%).
The loss is summed over the batch, as the C++ worker's (TrainerOptions::mean_loss = false).

Ids: Tessera keys rows by the 64-bit feature key (ps/feature_keys.h MakeKey) in a hash map. Here every
distinct key of the training and test samples gets its own embedding row (np.unique over the
keys of both; row 0 is never used), so no two keys share a row: the same model as Tessera's, with
no hash collisions and no per-step lookup cost (the map is built before the timed phase).

Data: the same samples as bench_train's cells: examples/pytorch/synthetic_data.py, the NumPy
port of worker/synthetic_data.cc (seed 1, Criteo-like cardinalities capped at
--max_cardinality), training on stream 0 in index order, testing on stream 1. All samples are
generated and turned into tensors before the timed phase (the C++ cells generate theirs inside
the timed loop), so samples_per_s counts the training loop alone: slicing the batch, forward,
backward, the three optimizer steps.

Threads: torch.set_num_threads(--threads); OPENBLAS_NUM_THREADS and OMP_NUM_THREADS are set to
the same count before torch is imported. The BLAS torch calls is reported (the library its
process loaded), so a run says whether OpenBLAS was in use.

Last line of output: one JSON object: samples_per_s (training samples / wall seconds of the
training loop), train_s, train_cpu_s (this process's CPU seconds in that loop, all threads),
test_auc, oracle_auc, threads, blas (the BLAS loaded: openblas-pthread, reference, ...), ...
Exit status 3 (with a message on stderr) when torch or numpy cannot be imported.
"""

import argparse
import json
import os
import sys
import time

SKIP_EXIT = 3
INSTALL_HINT = "bash scripts/install_bench_deps.sh"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train_samples", type=int, default=48000)
    ap.add_argument("--test_samples", type=int, default=20000)
    ap.add_argument("--batch_size", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1, help="torch (and BLAS) threads")
    ap.add_argument("--embedding_dim", type=int, default=16)
    ap.add_argument("--bottom_mlp", default="64", help="hidden widths, comma-separated")
    ap.add_argument("--top_mlp", default="64", help="hidden widths, comma-separated")
    ap.add_argument("--wide", type=int, default=1, help="1: train the wide part too")
    ap.add_argument("--max_cardinality", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1, help="seed of the planted model and samples")
    ap.add_argument("--torch_seed", type=int, default=7, help="seed of the initial parameters")
    ap.add_argument("--check", action="store_true",
                    help="only check that torch and numpy import; print the BLAS and exit")
    return ap.parse_args()


def widths(text):
    return [int(w) for w in text.split(",") if w.strip()]


def loaded_blas():
    """The BLAS library this process has mapped (Debian's torch calls libblas.so.3, which the
    alternatives system points at OpenBLAS, BLIS or the reference BLAS)."""
    libs = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                name = os.path.basename(path)
                if "blas" in name or "blis" in name:
                    libs.add(os.path.realpath(path))
    except OSError:
        return "unknown"
    if not libs:
        return "none loaded"
    return ",".join(sorted(libs))


def blas_kind(paths):
    p = paths.lower()
    if "openblas" in p:
        return "openblas-pthread" if "pthread" in p else (
            "openblas-openmp" if "openmp" in p else "openblas")
    if "blis" in p:
        return "blis"
    if "atlas" in p:
        return "atlas"
    if "/blas/" in p:
        return "reference"
    return p or "unknown"


def auc(scores, labels, np):
    """Mann-Whitney AUC with tied scores at their mean rank (worker/metrics.cc; the same function
    as examples/pytorch/train_dlrm.py)."""
    order = np.argsort(scores, kind="stable")
    s = scores[order]
    y = labels[order] > 0.5
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    ranks = np.repeat((starts + 1 + ends) / 2.0, ends - starts)
    pos = y.sum()
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        return 0.5
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def logloss(probs, labels, np):
    p = np.clip(probs.astype(np.float64), 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


def main():
    args = parse_args()
    threads = max(args.threads, 1)
    # Before torch loads OpenBLAS and OpenMP, which read these once.
    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        import numpy as np
        import torch
    except ImportError as e:
        print("pytorch_dlrm: cannot import %s (%s); install with: %s" %
              (e.name or "a module", e, INSTALL_HINT), file=sys.stderr)
        return SKIP_EXIT
    torch.set_num_threads(threads)

    here = os.path.dirname(os.path.abspath(__file__))
    sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(here), "examples", "pytorch"))
    from synthetic_data import SyntheticData  # noqa: E402

    # One small product so that the BLAS is loaded and called before it is named.
    torch.ones(64, 64) @ torch.ones(64, 64)
    blas_libs = loaded_blas()
    config = torch.__config__.show()
    blas_info = next((kv.split("=", 1)[1] for kv in config.replace(",", " ").split()
                      if kv.startswith("BLAS_INFO=")), "unknown")
    if args.check:
        print(json.dumps({"torch": torch.__version__, "numpy": np.__version__,
                          "blas": blas_kind(blas_libs), "blas_library": blas_libs,
                          "torch_blas_info": blas_info}))
        return 0

    torch.manual_seed(args.torch_seed)
    data = SyntheticData(seed=args.seed, max_cardinality=args.max_cardinality)
    nf, nd, dim = data.num_fields, data.num_dense, args.embedding_dim
    bottom_w, top_w = widths(args.bottom_mlp), widths(args.top_mlp)

    # ---------------------------------------------------------------- data (not timed)
    t_prep = time.perf_counter()

    def generate(stream, count, block=65536):
        parts = [data.generate(stream, s, min(block, count - s)) for s in range(0, count, block)]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    train = generate(0, args.train_samples)
    test = generate(1, args.test_samples)
    # Exact ids: one row per distinct key of both parts; row 0 stays unused.
    all_keys = np.concatenate([train["keys"][train["present"]], test["keys"][test["present"]]])
    vocab, inverse = np.unique(all_keys, return_inverse=True)
    n_train_keys = int(train["present"].sum())
    rows = (inverse + 1).astype(np.int64)
    num_rows = len(vocab) + 1

    def tensors(part, row_ids):
        present = part["present"]
        # EmbeddingBag input: the present keys' rows in (sample, field) order; one bag per
        # (sample, field), empty where the field is absent (pooled to zeros). The wide part
        # pools a sample's keys into one bag.
        per_slot = present.ravel().astype(np.int64)
        slot_offsets = np.concatenate([[0], np.cumsum(per_slot)[:-1]])
        per_sample = present.sum(axis=1).astype(np.int64)
        sample_offsets = np.concatenate([[0], np.cumsum(per_sample)[:-1]])
        return {
            "dense": torch.from_numpy(np.ascontiguousarray(part["dense"])),
            "labels": torch.from_numpy(part["labels"]),
            "rows": torch.from_numpy(row_ids),
            "slot_offsets": slot_offsets,        # numpy: sliced per batch
            "sample_offsets": sample_offsets,
            "n": len(part["labels"]),
        }

    tr = tensors(train, rows[:n_train_keys])
    te = tensors(test, rows[n_train_keys:])
    bsz = args.batch_size
    batches = []
    for s in range(0, tr["n"], bsz):
        e = min(s + bsz, tr["n"])
        k0 = int(tr["sample_offsets"][s])
        k1 = int(tr["sample_offsets"][e]) if e < tr["n"] else len(tr["rows"])
        batches.append((
            tr["dense"][s:e], tr["labels"][s:e], tr["rows"][k0:k1],
            torch.from_numpy(tr["slot_offsets"][s * nf:e * nf] - k0),
            torch.from_numpy(tr["sample_offsets"][s:e] - k0)))
    prep_s = time.perf_counter() - t_prep

    # ---------------------------------------------------------------- model
    def mlp(sizes, last_relu):
        layers = []
        for i in range(len(sizes) - 1):
            layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
            if i < len(sizes) - 2 or last_relu:
                layers.append(torch.nn.ReLU())
        return torch.nn.Sequential(*layers)

    class Dlrm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.EmbeddingBag(num_rows, dim, mode="sum", sparse=True)
            torch.nn.init.uniform_(self.emb.weight, -0.05, 0.05)
            self.wide = (torch.nn.EmbeddingBag(num_rows, 1, mode="sum", sparse=True)
                         if args.wide else None)
            if self.wide is not None:
                torch.nn.init.zeros_(self.wide.weight)
            self.bottom = mlp([nd] + bottom_w + [dim], last_relu=True)
            n = nf + 1
            self.top = mlp([dim + n * (n - 1) // 2] + top_w + [1], last_relu=False)
            self.bias = torch.nn.Parameter(torch.zeros(1))
            li, lj = torch.tril_indices(n, n, offset=-1)
            self.pairs = li * n + lj  # flat index into the n x n Gram matrix

        def forward(self, dense, rows, slot_offsets, sample_offsets):
            b = self.bottom(dense)
            pooled = self.emb(rows, slot_offsets).view(-1, nf, dim)
            t = torch.cat([b.unsqueeze(1), pooled], dim=1)
            gram = torch.bmm(t, t.transpose(1, 2)).flatten(1)
            logit = self.top(torch.cat([b, gram[:, self.pairs]], dim=1)).squeeze(1) + self.bias
            if self.wide is not None:
                logit = logit + self.wide(rows, sample_offsets).squeeze(1)
            return logit

    model = Dlrm()
    dense_params = (list(model.bottom.parameters()) + list(model.top.parameters()) +
                    [model.bias])
    optimizers = [
        torch.optim.Adagrad([model.emb.weight], lr=0.05, initial_accumulator_value=0.01,
                            eps=1e-8),
        # foreach: one multi-tensor update for the 9 dense tensors (the faster path here).
        torch.optim.Adam(dense_params, lr=3e-3, betas=(0.9, 0.999), eps=1e-8, foreach=True),
    ]
    if model.wide is not None:
        optimizers.append(torch.optim.Adagrad([model.wide.weight], lr=0.05,
                                              initial_accumulator_value=1.0, eps=1e-8))
    loss_fn = torch.nn.BCEWithLogitsLoss(reduction="sum")

    # ---------------------------------------------------------------- training (timed)
    loss_sum = 0.0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for dense, labels, brow, boff, bsoff in batches:
        for o in optimizers:
            o.zero_grad(set_to_none=True)
        loss = loss_fn(model(dense, brow, boff, bsoff), labels)
        loss.backward()
        for o in optimizers:
            o.step()
        loss_sum += loss.item()
    train_s = time.perf_counter() - t0
    train_cpu_s = time.process_time() - cpu0

    # ---------------------------------------------------------------- test (not timed)
    probs = []
    with torch.no_grad():
        for s in range(0, te["n"], 8192):
            e = min(s + 8192, te["n"])
            k0 = int(te["sample_offsets"][s])
            k1 = int(te["sample_offsets"][e]) if e < te["n"] else len(te["rows"])
            logit = model(te["dense"][s:e], te["rows"][k0:k1],
                          torch.from_numpy(te["slot_offsets"][s * nf:e * nf] - k0),
                          torch.from_numpy(te["sample_offsets"][s:e] - k0))
            probs.append(torch.sigmoid(logit).numpy())
    probs = np.concatenate(probs) if probs else np.zeros(0, np.float32)
    labels = test["labels"]
    out = {
        "bench": "pytorch_dlrm",
        "samples_per_s": tr["n"] / train_s if train_s > 0 else 0.0,
        "train_s": train_s,
        "train_cpu_s": train_cpu_s,
        "train_samples": tr["n"],
        "train_loss": loss_sum / max(tr["n"], 1),
        "test_samples": int(len(labels)),
        "test_auc": auc(probs, labels, np),
        "test_logloss": logloss(probs, labels, np),
        "oracle_auc": auc(test["true_probs"], labels, np),
        "threads": threads,
        "torch_threads": torch.get_num_threads(),
        "blas": blas_kind(blas_libs),
        "blas_library": blas_libs,
        "torch_blas_info": blas_info,
        "torch": torch.__version__,
        "embedding_rows": num_rows,
        "ids": "exact (one row per distinct key)",
        "wide_optimizer": "adagrad lr 0.05, initial accumulator 1 (for FTRL)" if args.wide
                          else "none",
        "prepare_s": prep_s,
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
