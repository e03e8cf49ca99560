"""A PyTorch DLRM whose embedding tables live in Tessera, on generated click data.

The model is the C++ worker's (worker/model.h, worker/cpu_model_internal.h): a bottom MLP on the
13 dense features (13 -> 64 -> 8, ReLU), one 8-wide embedding per categorical field (26 fields,
sum-pooled), the pairwise dot products of the 27 vectors, a top MLP (359 -> 64 -> 1) on
[bottom output, dots], a wide part (one FTRL weight per feature key) and a global bias.

Where each parameter lives:
- embeddings and wide weights: Tessera sparse tables behind one
  `tessera.torch.EmbeddingBagCollection`, updated by the servers' optimizers (Adagrad lr 0.05
  with initial accumulator 0.01; FTRL alpha 0.05, beta 1, L2 0.1), as in the C++ worker. Its
  forward pulls the batch's unique keys' rows, its backward pushes their gradients; a
  `PrefetchLoader` pulls the next batch while this one computes (one step stale, as the C++
  worker's prefetch).
- the MLPs and the bias: torch parameters with torch's Adam (lr 3e-3), the optimizer the C++
  worker runs on the server for them.

The data is worker/synthetic_data.cc's, sample for sample (synthetic_data.py), with the same
training and test streams, so the test AUC compares with `tessera-worker`'s.

    PYTHONPATH=build/python python3 examples/pytorch/train_dlrm.py --servers=127.0.0.1:7000
"""

import argparse
import json
import os
import sys
import time


def _threads_flag(argv):
    for i, a in enumerate(argv):
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
        if a == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
    return "1"


# Before torch loads OpenBLAS and OpenMP, which read these once: --threads bounds them too.
os.environ.setdefault("OPENBLAS_NUM_THREADS", _threads_flag(sys.argv))
os.environ.setdefault("OMP_NUM_THREADS", _threads_flag(sys.argv))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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


class Dlrm(torch.nn.Module):
    """The C++ worker's model; the embeddings and wide weights are in Tessera tables."""

    def __init__(self, client, args, num_dense, num_fields):
        super().__init__()
        dim, n = args.embedding_dim, num_fields + 1
        self.num_fields, self.dim = num_fields, dim
        # The C++ worker's tables (worker/model.cc), initializer seed 7.
        self.sparse = tt.EmbeddingBagCollection(client, [
            tt.TableConfig(args.table_prefix + "/emb", dim, ["fields"],
                           tessera.OptimizerSpec("adagrad", learning_rate=args.emb_lr,
                                                 initial_accumulator=0.01),
                           tessera.InitializerSpec("uniform", a=-0.05, b=0.05, seed=7)),
            tt.TableConfig(args.table_prefix + "/wide", 1, ["wide"],
                           tessera.OptimizerSpec("ftrl", learning_rate=args.wide_lr,
                                                 ftrl_beta=1.0, l1=0.0, l2=0.1))],
            max_pushes_in_flight=2)  # as tessera-worker (--max_pushes_in_flight=2)
        self.bottom = torch.nn.Sequential(*mlp([num_dense, 64, dim]))
        self.top = torch.nn.Sequential(*mlp([dim + n * (n - 1) // 2, 64]),
                                       torch.nn.Linear(64, 1))
        self.bias = torch.nn.Parameter(torch.zeros(1))

    def forward(self, batch):
        pooled = self.sparse(batch["sparse"])
        b = self.bottom(torch.from_numpy(batch["dense"]))
        # [b, the pairwise dots of b and the 26 pooled fields] in one compiled-core op.
        x = tt.dot_interaction(b, pooled["fields"].view(-1, self.num_fields, self.dim))
        return self.top(x)[:, 0] + self.bias + pooled["wide"][:, 0]


def with_bags(batch):
    """Adds the batch's sparse input: one bag per (sample, field) for the embeddings (empty
    where the field is absent) and one per sample for the wide part, over the same keys."""
    present = batch["present"]
    keys = batch["keys"][present]  # uint64
    batch["sparse"] = {"fields": tt.Bags(keys, lengths=present.ravel().astype(np.int64)),
                       "wide": tt.Bags(keys, lengths=present.sum(1))}
    return batch


class SyntheticBatches(torch.utils.data.IterableDataset):
    """Batches of samples [first, first + count) of a stream, generated a block at a time.
    Iterated by a DataLoader worker process (`loader`), so generation runs beside training on
    another core without holding the training loop's GIL (the C++ worker's --data_threads)."""

    def __init__(self, data, stream, first, count, batch_size, block=65536):
        super().__init__()
        self.data, self.stream, self.first, self.count = data, stream, first, count
        self.batch_size, self.block = batch_size, block

    def __iter__(self):
        end, start = self.first + self.count, self.first
        # The first blocks are small and then double up to `block`: the first batch is out
        # after a couple of batches' generation instead of a whole block's (~0.2 s), and later
        # blocks keep the generator's per-call cost small. The samples are the same.
        # Whole batches per block: only the last batch of the stream may be short.
        block = max(self.block // self.batch_size, 1) * self.batch_size
        size = min(2 * self.batch_size, block)
        while start < end:
            blk = self.data.generate(self.stream, start, min(size, end - start))
            start += len(blk["labels"])
            size = min(2 * size, block)
            for s in range(0, len(blk["labels"]), self.batch_size):
                yield {k: v[s:s + self.batch_size] for k, v in blk.items()}


def _as_is(batch):
    return batch  # NumPy arrays pass as they are (uint64 keys have no torch dtype)


def loader(data, stream, first, count, batch_size):
    """One worker process generating batches ahead (it starts on iter())."""
    return torch.utils.data.DataLoader(
        SyntheticBatches(data, stream, first, count, batch_size), batch_size=None,
        collate_fn=_as_is, num_workers=1, prefetch_factor=4)


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
                    help="generate every training batch before the timed loop (benchmarks: the "
                         "data source's cost left out; the batches' Bags are still built in it)")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    data = SyntheticData(seed=args.seed)
    nf, nd = data.num_fields, data.num_dense

    client = tessera.Client(args.servers)
    model = Dlrm(client, args, nd, nf)
    # Only the MLPs and the bias: the tables' rows are updated by the servers.
    # foreach: one multi-tensor update of the 9 tensors instead of a loop over them.
    opt = torch.optim.Adam(model.parameters(), lr=args.dense_lr, foreach=True)

    source = (list(SyntheticBatches(data, 0, 0, args.train_samples, args.batch_size))
              if args.pregenerate else loader(data, 0, 0, args.train_samples, args.batch_size))
    train = map(with_bags, iter(source))
    t0 = last = time.monotonic()
    samples, loss_sum, loss_n, steps = 0, 0.0, 0, 0
    for b in tt.PrefetchLoader(train, model.sparse, features=lambda b: b["sparse"]):
        # The sum over the batch, as the C++ worker (Trainer mean_loss = false): the servers'
        # Adagrad and FTRL hyper-parameters are for that scale.
        loss = F.binary_cross_entropy_with_logits(model(b), torch.from_numpy(b["labels"]),
                                                  reduction="sum")
        opt.zero_grad()
        loss.backward()  # pushes the rows' gradients
        opt.step()
        bsz = len(b["labels"])
        samples += bsz
        steps += 1
        loss_sum += loss.item()
        loss_n += bsz
        now = time.monotonic()
        if now - last >= args.progress_interval_s:
            print("step %d samples %d %.0f samples/s loss %.4f" %
                  (steps, samples, samples / (now - t0), loss_sum / loss_n), flush=True)
            loss_sum, loss_n, last = 0.0, 0, now
    model.sparse.wait_pushes()
    train_s = time.monotonic() - t0

    probs, labels, true_probs = [], [], []
    with torch.no_grad():
        for b in map(with_bags, loader(data, 1, 0, args.test_samples, 8192)):
            probs.append(torch.sigmoid(model(b)).numpy())
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
