"""The ceiling of bench_python's torch trainers: the DLRM's dense part alone in torch.

examples/pytorch/train_dlrm.py's model without Tessera and without data: the bottom MLP
(13 -> 64 -> 8, ReLU), the pairwise dots of the 27 vectors (torch.bmm), the top MLP
(359 -> 64 -> 1), the bias, the summed BCE loss, backward (down to the pooled embeddings, as in
training) and torch's Adam step, on one fixed random batch. Whatever a trainer adds (data,
pulls, pooling, pushes) comes on top of this, so its samples/s bound every torch trainer of
this model on this machine and thread count. bench_python runs it as its `torch_dense_only`
cell, and with `--interaction=fused` (the pairwise dots by tessera.torch.dot_interaction, as
train_dlrm.py computes them) as its `torch_dense_fused` cell; alone:

    [PYTHONPATH=build/python] python3 benchmarks/torch_dense_step.py [--threads=1] [--steps=200]
                                                                     [--interaction=fused]

Last line: one JSON object with samples_per_s (batch 1024 x steps / wall seconds of the steps).
"""

import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch_size", type=int, default=1024)
    ap.add_argument("--embedding_dim", type=int, default=8)
    ap.add_argument("--interaction", choices=("bmm", "fused"), default="bmm",
                    help="bmm: torch.bmm and a gather of the pairs; fused: "
                         "tessera.torch.dot_interaction (needs the tessera module)")
    args, _ = ap.parse_known_args()  # bench_python's common flags are accepted and ignored
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    fused = None
    if args.interaction == "fused":
        import tessera.torch
        fused = tessera.torch.dot_interaction
    torch.manual_seed(1)
    bsz, nf, nd, dim = args.batch_size, 26, 13, args.embedding_dim
    n = nf + 1
    bottom = torch.nn.Sequential(torch.nn.Linear(nd, 64), torch.nn.ReLU(),
                                 torch.nn.Linear(64, dim), torch.nn.ReLU())
    top = torch.nn.Sequential(torch.nn.Linear(dim + n * (n - 1) // 2, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 1))
    bias = torch.nn.Parameter(torch.zeros(1))
    li, lj = torch.tril_indices(n, n, offset=-1)
    opt = torch.optim.Adam(list(bottom.parameters()) + list(top.parameters()) + [bias],
                           lr=3e-3)
    dense = torch.rand(bsz, nd)
    pooled_rows = torch.rand(bsz * nf, dim) * 0.1 - 0.05
    wide = torch.zeros(bsz)
    labels = (torch.rand(bsz) < 0.25).float()

    def step():
        pooled = pooled_rows.clone().requires_grad_(True)  # the embeddings' gradient is computed
        b = bottom(dense)
        if fused is not None:
            x = fused(b, pooled.view(-1, nf, dim))
        else:
            t = torch.cat([b[:, None, :], pooled.view(-1, nf, dim)], 1)
            x = torch.cat([b, torch.bmm(t, t.transpose(1, 2))[:, li, lj]], dim=1)
        logit = top(x)[:, 0] + bias + wide
        loss = F.binary_cross_entropy_with_logits(logit, labels, reduction="sum")
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(5):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    wall = time.perf_counter() - t0
    print(json.dumps({"bench": "torch_dense_step", "steps": args.steps, "batch_size": bsz,
                      "threads": args.threads, "interaction": args.interaction,
                      "train_s": wall,
                      "samples_per_s": args.steps * bsz / wall}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
