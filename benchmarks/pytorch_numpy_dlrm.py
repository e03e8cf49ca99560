"""A PyTorch DLRM whose embedding tables live in Tessera, on generated click data.

The model is the C++ worker's (worker/model.h, worker/cpu_model_internal.h): a bottom MLP on the
13 dense features (13 -> 64 -> 8, ReLU), one 8-wide embedding per categorical field (26 fields,
sum-pooled), the pairwise dot products of the 27 vectors, a top MLP (359 -> 64 -> 1) on
[bottom output, dots], a wide part (one FTRL weight per feature key) and a global bias.

Where each parameter lives:
- embeddings and wide weights: Tessera sparse tables, updated by the servers' optimizers
  (Adagrad lr 0.05 with initial accumulator 0.01; FTRL alpha 0.05, beta 1, L2 0.1), as in the
  C++ worker. Each step pulls the batch's rows into NumPy arrays, runs forward and backward in
  torch on tensors that share those arrays' memory, and pushes the rows' gradients back.
- the MLPs and the bias: torch parameters with torch's Adam (lr 3e-3), the optimizer the C++
  worker runs on the server for them.

The data is worker/synthetic_data.cc's, sample for sample (synthetic_data.py), with the same
training and test streams, so the test AUC compares with `tessera-worker`'s.

    PYTHONPATH=build/python python3 examples/pytorch/train_dlrm.py --servers=127.0.0.1:7000
"""

import argparse
import json
import os
import queue
import sys
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F

import tessera

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples", "pytorch"))
from synthetic_data import SyntheticData  # noqa: E402


def auc(scores, labels):
    """Mann-Whitney AUC with tied scores at their mean rank (worker/metrics.cc)."""
    order = np.argsort(scores, kind="stable")
    s = scores[order]
    y = labels[order] > 0.5
    # Mean 1-based rank of each run of equal scores.
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    ranks = np.repeat((starts + 1 + ends) / 2.0, ends - starts)
    pos = y.sum()
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        return 0.5
    return (ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg)


def logloss(probs, labels):
    p = np.clip(probs.astype(np.float64), 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


def mlp(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        layers.append(torch.nn.ReLU())
    return layers


class DenseModel(torch.nn.Module):
    """The model's dense part; the embedding rows and wide weights come in as tensors."""

    def __init__(self, num_dense, num_fields, dim, bottom, top):
        super().__init__()
        self.bottom = torch.nn.Sequential(*mlp([num_dense] + bottom + [dim]))
        n = num_fields + 1
        top_layers = mlp([dim + n * (n - 1) // 2] + top)
        top_layers.append(torch.nn.Linear(top[-1] if top else dim + n * (n - 1) // 2, 1))
        self.top = torch.nn.Sequential(*top_layers)
        self.bias = torch.nn.Parameter(torch.zeros(1))
        # Pairs (i, j), j < i, in the C++ model's order (row by row).
        self.li, self.lj = torch.tril_indices(n, n, offset=-1)

    def forward(self, dense, bags, wide_sum):
        b = self.bottom(dense)
        t = torch.cat([b[:, None, :], bags], dim=1)
        dots = torch.bmm(t, t.transpose(1, 2))[:, self.li, self.lj]
        return self.top(torch.cat([b, dots], dim=1))[:, 0] + self.bias + wide_sum


class Step:
    """One batch's sparse part: the present keys, their rows, and where they go."""

    def __init__(self, client, emb, wide, batch, dim):
        present = batch["present"]
        self.batch = batch
        self.keys = batch["keys"][present]  # uint64, C-contiguous
        self.slots = torch.from_numpy(np.flatnonzero(present.ravel()))
        self.rows = np.empty((len(self.keys), dim), np.float32)
        self.wide = np.empty((len(self.keys), 1), np.float32)
        # Both pulls in flight at once; the arrays are written in place.
        self.pulls = [client.pull_async(emb, self.keys, out=self.rows),
                      client.pull_async(wide, self.keys, out=self.wide)]

    def wait(self):
        for p in self.pulls:
            p.wait()

    def tensors(self, bsz, nf, dim, requires_grad):
        # torch.from_numpy shares the pulled arrays' memory: no copy on the way in.
        e = torch.from_numpy(self.rows).requires_grad_(requires_grad)
        w = torch.from_numpy(self.wide).requires_grad_(requires_grad)
        bags = torch.zeros(bsz * nf, dim).index_copy(0, self.slots, e).view(bsz, nf, dim)
        wide_sum = torch.zeros(bsz * nf).index_copy(0, self.slots, w[:, 0]).view(bsz, nf).sum(1)
        return e, w, bags, wide_sum


def batches(data, stream, first, count, batch_size, block=65536):
    """Batches of samples [first, first + count), generated a block ahead on a thread (NumPy
    releases the GIL in its loops, so generation overlaps training)."""
    q = queue.Queue(maxsize=2)

    def produce():
        for start in range(first, first + count, block):
            q.put(data.generate(stream, start, min(block, first + count - start)))
        q.put(None)

    threading.Thread(target=produce, daemon=True).start()
    while True:
        blk = q.get()
        if blk is None:
            return
        n = len(blk["labels"])
        for s in range(0, n, batch_size):
            yield {k: v[s:s + batch_size] for k, v in blk.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", required=True, help="host:port,... of the Tessera servers")
    ap.add_argument("--train_samples", type=int, default=2500000)
    ap.add_argument("--test_samples", type=int, default=100000)
    ap.add_argument("--batch_size", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=1, help="seed of the planted model")
    ap.add_argument("--embedding_dim", type=int, default=8)
    ap.add_argument("--emb_lr", type=float, default=0.05)
    ap.add_argument("--dense_lr", type=float, default=0.003)
    ap.add_argument("--wide_lr", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--table_prefix", default="pytorch")
    ap.add_argument("--progress_interval_s", type=float, default=5.0)
    ap.add_argument("--pregenerate", action="store_true",
                    help="generate every training batch before the timed loop (bench_python's "
                         "--pregenerate: the data source's cost left out of both Python trainers)")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    data = SyntheticData(seed=args.seed)
    nf, nd, dim = data.num_fields, data.num_dense, args.embedding_dim

    client = tessera.Client(args.servers)
    # The C++ worker's tables (worker/model.cc), initializer seed 7.
    emb = client.create_table(tessera.TableSpec.sparse(
        args.table_prefix + "/emb", dim,
        tessera.OptimizerSpec("adagrad", learning_rate=args.emb_lr, initial_accumulator=0.01),
        tessera.InitializerSpec("uniform", a=-0.05, b=0.05, seed=7)))
    wide = client.create_table(tessera.TableSpec.sparse(
        args.table_prefix + "/wide", 1,
        tessera.OptimizerSpec("ftrl", learning_rate=args.wide_lr, ftrl_beta=1.0, l1=0.0, l2=0.1)))
    model = DenseModel(nd, nf, dim, [64], [64])
    opt = torch.optim.Adam(model.parameters(), lr=args.dense_lr)

    it = batches(data, 0, 0, args.train_samples, args.batch_size)
    if args.pregenerate:
        it = iter(list(it))
    t0 = last = time.monotonic()
    samples, loss_sum, loss_n, steps = 0, 0.0, 0, 0
    nxt = next(it, None)
    step = Step(client, emb, wide, nxt, dim) if nxt is not None else None
    while step is not None:
        step.wait()
        b = step.batch
        bsz = len(b["labels"])
        e, w, bags, wide_sum = step.tensors(bsz, nf, dim, requires_grad=True)
        logit = model(torch.from_numpy(b["dense"]), bags, wide_sum)
        # The sum over the batch, as the C++ worker (Trainer mean_loss = false): the servers'
        # Adagrad and FTRL hyper-parameters are for that scale.
        loss = F.binary_cross_entropy_with_logits(logit, torch.from_numpy(b["labels"]),
                                                  reduction="sum")
        opt.zero_grad()
        loss.backward()
        opt.step()
        # Gradients go out straight from the tensors' memory (C-contiguous float32).
        pushes = [client.push_async(emb, step.keys, e.grad.numpy()),
                  client.push_async(wide, step.keys, w.grad.numpy())]
        # The next batch's pulls go out behind this batch's pushes, so they see them.
        nxt = next(it, None)
        step = Step(client, emb, wide, nxt, dim) if nxt is not None else None
        for p in pushes:
            p.wait()
        samples += bsz
        steps += 1
        loss_sum += loss.item()
        loss_n += bsz
        now = time.monotonic()
        if now - last >= args.progress_interval_s:
            print("step %d samples %d %.0f samples/s loss %.4f" %
                  (steps, samples, samples / (now - t0), loss_sum / loss_n), flush=True)
            loss_sum, loss_n, last = 0.0, 0, now
    train_s = time.monotonic() - t0

    probs, labels, true_probs = [], [], []
    with torch.no_grad():
        for b in batches(data, 1, 0, args.test_samples, 8192):
            s = Step(client, emb, wide, b, dim)
            s.wait()
            _, _, bags, wide_sum = s.tensors(len(b["labels"]), nf, dim, requires_grad=False)
            probs.append(torch.sigmoid(model(torch.from_numpy(b["dense"]), bags, wide_sum)).numpy())
            labels.append(b["labels"])
            true_probs.append(b["true_probs"])
    probs, labels, true_probs = map(np.concatenate, (probs, labels, true_probs))
    a, ll = auc(probs, labels), logloss(probs, labels)
    oa, oll = auc(true_probs, labels), logloss(true_probs, labels)
    print("test samples %d auc %.4f logloss %.4f oracle_auc %.4f oracle_logloss %.4f (gap %.4f)" %
          (len(labels), a, ll, oa, oll, oa - a))
    print(json.dumps({"data": "synthetic", "framework": "pytorch", "train_samples": samples,
                      "train_s": round(train_s, 1), "samples_per_s": round(samples / train_s),
                      "test_auc": round(a, 4), "test_logloss": round(ll, 4),
                      "oracle_auc": round(oa, 4), "oracle_logloss": round(oll, 4)}))
    client.close()


if __name__ == "__main__":
    main()
