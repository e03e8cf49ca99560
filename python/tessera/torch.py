"""PyTorch modules whose parameters live in Tessera tables (`import tessera.torch`).

- `EmbeddingBagCollection`: pooled embeddings (sum or mean, optional per-sample weights) of
  several features over one or more Tessera sparse tables; `EmbeddingCollection`: the same
  without pooling (one row per key). Their forward pulls each table's unique keys of the batch
  once; their backward pushes the gradients of those rows (repeated keys' gradients summed) to
  the servers, whose optimizer applies them. No torch optimizer is needed for them.
- `TesseraDense`: a torch module whose parameters live in Tessera dense tables (pulled in
  forward, their gradients pushed in backward).
- `Bags`: one feature's keys of a batch, cut into bags by offsets or lengths (as
  `torch.nn.EmbeddingBag`'s input); `PrefetchLoader`: an iterator over a DataLoader that issues
  the next batch's pulls while the current batch computes.
- `dot_interaction`: DLRM's pairwise dots of the dense vector and the pooled fields, with its
  backward in the compiled core on the CPU (one pass per sample instead of torch's per-sample
  `bmm` and pair gather).

A module is not thread-safe: one training loop drives it (the `tessera.Client` under it is).

Staleness: a pull reads the rows as the servers hold them when it is served. `forward` on a
batch that was not prefetched first waits for this module's pushes still in flight, so it sees
every earlier step's update. A prefetched batch's pull goes out before the current step's
backward pushes, so rows in both batches miss the current step's update (one step stale, as
the C++ worker's prefetch); pushes already final when it is sent are in it, pushes still in
flight then may or may not be. A forward on a prefetched batch waits only for the pushes of
steps older than the last `max_pushes_in_flight` (default 1) steps.

See python/README.md ("tessera.torch").
"""
import collections

import numpy as np
import torch

import tessera

__all__ = ["Bags", "TableConfig", "EmbeddingBagCollection", "EmbeddingCollection",
           "TesseraDense", "PrefetchLoader", "dot_interaction"]

_POOLINGS = ("sum", "mean")


def _is_int_dtype(t):
    return not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool


def _check_1d_int(name, x):
    """A 1-D integer torch tensor or NumPy array, else TypeError/ValueError naming `name`."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "iu":
            raise TypeError("%s: expected an integer array, got dtype %s" % (name, x.dtype))
    elif isinstance(x, torch.Tensor):
        if not _is_int_dtype(x):
            raise TypeError("%s: expected an integer tensor, got dtype %s" % (name, x.dtype))
    else:
        raise TypeError("%s: expected a torch.Tensor or numpy.ndarray, got %s" %
                        (name, type(x).__name__))
    if x.ndim != 1:
        raise ValueError("%s: expected a 1-D array, got shape %s" % (name, tuple(x.shape)))


def _to_long(x, device):
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x.astype(np.int64, copy=False))
    return x.to(device=device, dtype=torch.int64)


class Bags:
    """One feature's keys in a batch, cut into bags (`torch.nn.EmbeddingBag`'s input).

    values:  1-D keys: an int64 torch tensor (non-negative) or a NumPy integer array (uint64
             for the full 64-bit key range). Keys may repeat, within a bag and across bags.
    offsets: 1-D, one entry per bag: where it starts in `values` (non-decreasing, first 0);
    lengths: or 1-D, one entry per bag: how many keys it has (exactly one of the two).
    weights: optional 1-D float tensor, one per key (per-sample weights).

    An empty bag pools to zeros. Tensors may be on the CPU or on the collection's device.
    """

    __slots__ = ("values", "offsets", "weights", "num_keys")

    def __init__(self, values, offsets=None, lengths=None, weights=None):
        _check_1d_int("values", values)
        n = int(values.shape[0])
        if (offsets is None) == (lengths is None):
            raise ValueError("Bags: give exactly one of offsets= and lengths=")
        if lengths is not None:
            _check_1d_int("lengths", lengths)
            lengths = _to_long(lengths, "cpu" if isinstance(lengths, np.ndarray)
                               else lengths.device)
            if len(lengths) and int(lengths.min()) < 0:
                raise ValueError("lengths: negative bag length")
            if int(lengths.sum()) != n:
                raise ValueError("lengths: sum %d != %d values" % (int(lengths.sum()), n))
            offsets = torch.cumsum(lengths, 0) - lengths
        else:
            _check_1d_int("offsets", offsets)
            offsets = _to_long(offsets, "cpu" if isinstance(offsets, np.ndarray)
                               else offsets.device)
            if len(offsets) and (int(offsets[0]) != 0 or int(offsets[-1]) > n):
                raise ValueError("offsets: must start at 0 and stay within the %d values, got "
                                 "first %d, last %d" % (n, int(offsets[0]), int(offsets[-1])))
        if weights is not None:
            if not isinstance(weights, torch.Tensor) or not weights.dtype.is_floating_point:
                raise TypeError("weights: expected a floating-point torch.Tensor, got %s" %
                                (getattr(weights, "dtype", type(weights).__name__),))
            if tuple(weights.shape) != (n,):
                raise ValueError("weights: expected shape (%d,) (one per value), got %s" %
                                 (n, tuple(weights.shape)))
        self.values, self.offsets, self.weights, self.num_keys = values, offsets, weights, n

    @property
    def num_bags(self):
        return int(self.offsets.shape[0])

    def lengths(self):
        ends = torch.cat([self.offsets[1:], self.offsets.new_tensor([self.num_keys])])
        return ends - self.offsets


def _keys_u64(values, what):
    """`values` as a C-contiguous NumPy uint64 array (no copy for CPU int64 tensors)."""
    if isinstance(values, torch.Tensor):
        v = values.detach()
        if v.device.type != "cpu":
            v = v.cpu()
        v = v.to(torch.int64).contiguous().numpy()
    else:
        v = values
    if v.dtype != np.uint64:
        if len(v) and int(v.min()) < 0:
            raise ValueError("%s: negative key %d" % (what, int(v.min())))
        v = v.astype(np.int64, copy=False).view(np.uint64)
    return np.ascontiguousarray(v)


class TableConfig:
    """A Tessera sparse table and the features it embeds.

    name: the table's name on the servers (created if absent; the same spec again is fine).
    dim: row width. features: names of the `Bags` it embeds (default: [name]).
    optimizer / initializer: tessera.OptimizerSpec / InitializerSpec (the servers apply them).
    pooling: "sum" or "mean" (EmbeddingBagCollection only). Mean with weights is
    sum(w_i * row_i) / (number of keys in the bag).
    """

    def __init__(self, name, dim, features=None, optimizer=None, initializer=None,
                 pooling="sum"):
        if pooling not in _POOLINGS:
            raise ValueError("pooling: expected one of %s, got %r" % (_POOLINGS, pooling))
        if int(dim) <= 0:
            raise ValueError("dim: expected a positive width, got %r" % (dim,))
        self.name, self.dim, self.pooling = name, int(dim), pooling
        self.features = list(features) if features is not None else [name]
        self.optimizer = optimizer if optimizer is not None else tessera.OptimizerSpec("sgd")
        self.initializer = initializer if initializer is not None else tessera.InitializerSpec()

    def spec(self):
        return tessera.TableSpec.sparse(self.name, self.dim, self.optimizer, self.initializer)


def _unique(flat):
    """The unique keys of `flat` (uint64, increasing) and each value's index into them (an
    int64 tensor), from the compiled core (one hash pass and a sort of the unique keys)."""
    keys, inverse = tessera._tessera.unique_keys(flat)
    return keys, torch.from_numpy(inverse)


def _segment_sum(x, bounds):
    """Row sums of x over the runs [bounds[i], bounds[i+1]): a float64 running sum read at the
    bounds (exact to float32 rounding; an empty run is zeros). The device path's pooling; on
    the CPU the compiled core's bag_sum does it in one pass."""
    c = torch.zeros((x.shape[0] + 1,) + tuple(x.shape[1:]), dtype=torch.float64,
                    device=x.device)
    c[1:] = torch.cumsum(x, 0, dtype=torch.float64)
    return (c[bounds[1:]] - c[bounds[:-1]]).to(x.dtype)


class _TablePull:
    """One table's pull for one batch: the unique keys, where each value's row is, the rows
    (and on a device, how to sum the values' gradients per key: perm, bounds)."""

    __slots__ = ("keys", "inverse", "perm", "bounds", "rows", "future", "device_rows")


class _Plan:
    """One feature's part of a table's lookup: its values' rows (index: slice of the table's
    inverse), pooled into bags by `bounds` (K + 1 bag bounds; None: unpooled), scaled by
    weights[w] if w >= 0. `host`: the CPU kernels' arrays (index, bounds, weights), or None
    on a device."""

    __slots__ = ("feature", "index", "bounds", "seg", "w", "num_out", "host")

    def segments(self):
        """Each value's bag (int64, on the bounds' device); computed on first use."""
        if self.seg is None:
            b = self.bounds
            self.seg = torch.repeat_interleave(torch.arange(len(b) - 1, device=b.device),
                                               b[1:] - b[:-1])
        return self.seg


def _lookup(rows, plans, weights):
    outs = []
    for p in plans:
        if p.host is not None:
            index, bounds, w = p.host
            out = torch.empty((p.num_out, rows.shape[1]), dtype=torch.float32)
            tessera._tessera.bag_sum(rows.numpy(), index, bounds, w, out.numpy())
            outs.append(out)
            continue
        g = rows[p.index]
        if p.w >= 0:
            g = g * weights[p.w][:, None]
        outs.append(_segment_sum(g, p.bounds) if p.bounds is not None else g)
    return outs


def _device_grad_rows(ctx, gouts, weights, wgrads):
    """The backward on a device: each value's gradient, summed per key by a sort."""
    rows = ctx.pull.device_rows
    parts = []
    for p, go in zip(ctx.plans, gouts):
        if go is None:
            go = rows.new_zeros((p.num_out, rows.shape[1]))
        gg = go[p.segments()] if p.bounds is not None else go  # each value's gradient
        if p.w >= 0:
            if ctx.needs_input_grad[6 + p.w]:
                wgrads[p.w] = (gg * rows[p.index]).sum(1)
            gg = gg * weights[p.w][:, None]
        parts.append(gg)
    g = parts[0] if len(parts) == 1 else torch.cat(parts)
    return _segment_sum(g[ctx.pull.perm], ctx.pull.bounds)


def _host_grad_rows(ctx, gouts, weights, wgrads):
    """The backward on the CPU: the compiled core's bag_sum_backward adds each value's
    gradient into its key's row (repeated keys summed) in one pass per feature."""
    rows = ctx.pull.device_rows
    grad_rows = torch.zeros(rows.shape, dtype=torch.float32)
    for p, go in zip(ctx.plans, gouts):
        if go is None:
            continue
        go = go.detach().to(torch.float32).contiguous()
        index, bounds, w = p.host
        if p.w >= 0 and ctx.needs_input_grad[6 + p.w]:
            gg = go[p.segments()] if p.bounds is not None else go
            wgrads[p.w] = (gg * rows[p.index]).sum(1)
        tessera._tessera.bag_sum_backward(go.numpy(), index, bounds, w, grad_rows.numpy())
    return grad_rows


class _Lookup(torch.autograd.Function):
    """The features' rows of one table, pooled; its backward sums the gradients of repeated
    keys (a scatter-add by key) and pushes one gradient row per unique key to the table."""

    @staticmethod
    def forward(ctx, anchor, owner, name, pull, plans, group, *weights):
        ctx.owner, ctx.name, ctx.pull, ctx.plans, ctx.group = owner, name, pull, plans, group
        ctx.save_for_backward(*weights)
        return tuple(_lookup(pull.device_rows, plans, weights))

    @staticmethod
    def backward(ctx, *gouts):
        weights = ctx.saved_tensors
        wgrads = [None] * len(weights)
        on_host = all(p.host is not None for p in ctx.plans)
        grad_rows = (_host_grad_rows if on_host else _device_grad_rows)(ctx, gouts, weights,
                                                                       wgrads)
        if len(ctx.pull.keys):
            ctx.group.append(ctx.owner._push(ctx.name, ctx.pull.keys, grad_rows))
        return (None,) * 6 + tuple(wgrads)


class _Collection(torch.nn.Module):
    """client: a tessera.Client. tables: TableConfigs (each table is created on the servers
    if absent; a feature belongs to one table). device: where outputs live ("cpu" or a CUDA
    device: rows are pulled into pinned host memory and copied up). max_prefetch: batches
    whose pulls may wait for their forward (older ones are dropped). max_pushes_in_flight:
    steps whose pushes a forward on a prefetched batch does not wait for."""

    def __init__(self, client, tables, device="cpu", max_prefetch=2, max_pushes_in_flight=1):
        super().__init__()
        if not isinstance(client, tessera.Client):
            raise TypeError("client: expected a tessera.Client, got %s" % type(client).__name__)
        self.client = client
        self.configs = list(tables)
        if not self.configs:
            raise ValueError("tables: expected at least one TableConfig")
        self.device = torch.device(device)
        self.tables = {}
        self._feature_table = {}
        for c in self.configs:
            if c.name in self.tables:
                raise ValueError("tables: '%s' given twice" % c.name)
            self.tables[c.name] = client.create_table(c.spec())
            for f in c.features:
                if f in self._feature_table:
                    raise ValueError("feature '%s' is in two tables" % f)
                self._feature_table[f] = c
        self._pin = self.device.type == "cuda"
        self._anchor = torch.empty(0, requires_grad=True)
        self._prefetched = []
        self._groups = collections.deque()  # per forward: the futures of its backward's pushes
        self._max_prefetch = max_prefetch
        self._max_pushes_in_flight = max_pushes_in_flight
        self.prefetch_hits = 0
        self.prefetch_misses = 0

    # ---- pulls
    def _check(self, features):
        if not hasattr(features, "keys"):
            raise TypeError("features: expected a mapping of feature name to Bags, got %s" %
                            type(features).__name__)
        for f in features.keys():
            if f not in self._feature_table:
                raise ValueError("feature '%s' is in no table (known: %s)" %
                                 (f, sorted(self._feature_table)))
        for f, b in features.items():
            if not isinstance(b, Bags):
                raise TypeError("features['%s']: expected tessera.torch.Bags, got %s" %
                                (f, type(b).__name__))
            for name in ("values", "offsets", "weights"):
                t = getattr(b, name)
                if isinstance(t, torch.Tensor) and t.device.type != "cpu" and \
                        t.device != self.device:
                    raise ValueError("features['%s'].%s is on %s; this module is on %s" %
                                     (f, name, t.device, self.device))

    def _start(self, features):
        self._check(features)
        pulls, cache = {}, {}
        for c in self.configs:
            vals = [features[f].values for f in c.features if f in features]
            if not vals:
                continue
            ident = tuple(id(v) for v in vals)
            if ident not in cache:
                parts = [_keys_u64(v, "features['%s'].values" % f)
                         for f, v in zip([f for f in c.features if f in features], vals)]
                cache[ident] = _unique(parts[0] if len(parts) == 1 else np.concatenate(parts))
            p = _TablePull()
            p.keys, p.inverse = cache[ident]
            p.perm = p.bounds = None
            p.rows = torch.empty((len(p.keys), c.dim), dtype=torch.float32, pin_memory=self._pin)
            p.future = (self.client.pull_async(self.tables[c.name], p.keys, out=p.rows.numpy())
                        if len(p.keys) else None)
            pulls[c.name] = p
        return pulls

    def prefetch(self, features):
        """Issues the pulls of a batch that a later forward(features) (the same object) will
        use; returns at once. Rows are as the servers hold them when the pulls are served (see
        the module docstring on staleness). At most max_prefetch batches wait; an older one
        is dropped (its pulls cancelled)."""
        self._prefetched.append((features, self._start(self._normalize(features))))
        if len(self._prefetched) > self._max_prefetch:
            self._prefetched.pop(0)

    def wait_pushes(self):
        """Waits for this module's pushes in flight (raises the first error)."""
        self._wait_groups(0)

    def _wait_groups(self, keep):
        while len(self._groups) > keep:
            for f in self._groups.popleft():
                f.wait()

    def _normalize(self, features):
        return features

    def _pulls_of(self, features, normalized):
        for i, (feats, pulls) in enumerate(self._prefetched):
            if feats is features:
                del self._prefetched[i]
                self.prefetch_hits += 1
                self._wait_groups(self._max_pushes_in_flight)
                return pulls
        self.prefetch_misses += 1
        self.wait_pushes()  # read your writes: the pull goes out after the last push is in
        return self._start(normalized)

    def _table_outputs(self, pulls, name, plans, weights, group):
        """The features' outputs of one table's pull, on the module's device, in the autograd
        graph when grad is enabled (the push of their gradient joins `group`)."""
        p = pulls[name]
        if p.future is not None:
            p.future.wait()
        dev = self.device
        if dev.type == "cpu":
            p.device_rows = p.rows
            inverse = p.inverse.numpy()
            for plan in plans:
                plan.host = (inverse[plan.index],) + plan.host[1:]
                plan.index = p.inverse[plan.index]
        else:
            p.device_rows = p.rows.to(dev, non_blocking=True)
            # The backward's scatter-add by key: the values sorted by key, and each key's run.
            inv = p.inverse
            p.perm = torch.sort(inv, stable=True)[1].to(dev)
            counts = torch.bincount(inv, minlength=len(p.keys))
            p.bounds = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)]).to(dev)
            for plan in plans:
                plan.index = p.inverse[plan.index].to(dev, non_blocking=True)
        if torch.is_grad_enabled():
            return _Lookup.apply(self._anchor, self, name, p, plans, group, *weights)
        return _lookup(p.device_rows, plans, weights)

    def _plans(self, config, features, pooled):
        """The plans of a table's features present in `features`, their weights (float32, on
        the device) and each feature's scale for mean pooling (or None)."""
        plans, weights, scales, start = [], [], [], 0
        on_host = self.device.type == "cpu"
        for f in config.features:
            if f not in features:
                continue
            b = features[f]
            p = _Plan()
            p.feature, p.index, p.w, p.bounds, p.seg, p.host = \
                f, slice(start, start + b.num_keys), -1, None, None, None
            start += b.num_keys
            scale, w = None, None
            if pooled:
                offsets = b.offsets.to(self.device)
                p.bounds = torch.cat([offsets, offsets.new_tensor([b.num_keys])])
                p.num_out = len(offsets)
                if config.pooling == "mean":
                    lengths = p.bounds[1:] - p.bounds[:-1]
                    scale = 1.0 / lengths.clamp(min=1).to(torch.float32)
                if b.weights is not None:
                    p.w = len(weights)
                    w = b.weights.to(device=self.device, dtype=torch.float32).contiguous()
                    weights.append(w)
            else:
                p.num_out = b.num_keys
            if on_host:
                # The index is filled in when the pull's inverse is known (_table_outputs).
                p.host = (None, p.bounds.numpy() if p.bounds is not None else None,
                          w.detach().numpy() if w is not None else None)
            plans.append(p)
            scales.append(scale)
        return plans, weights, scales

    # ---- pushes
    def _push(self, name, keys, grad):
        grad = grad.detach()
        if grad.dtype != torch.float32:
            grad = grad.float()
        if grad.device.type != "cpu":
            host = torch.empty(grad.shape, dtype=torch.float32, pin_memory=True)
            host.copy_(grad)
            grad = host
        return self.client.push_async(self.tables[name], keys, grad.contiguous().numpy())

    def _new_group(self):
        group = []
        if torch.is_grad_enabled():
            self._groups.append(group)
        return group


class EmbeddingBagCollection(_Collection):
    """Pooled embeddings of several features over Tessera sparse tables.

    forward(features: {name: Bags}) -> {name: Tensor (num_bags, dim)} in the tables' order,
    on `device`. Backward pushes the gradients of the batch's rows (see the module docstring).

        ebc = EmbeddingBagCollection(client, [TableConfig("t", 16, ["user", "item"])])
        out = ebc({"user": Bags(keys, offsets=offs), "item": Bags(k2, lengths=lens)})
    """

    def forward(self, features):
        pulls = self._pulls_of(features, features)
        group = self._new_group()
        out = {}
        for c in self.configs:
            if c.name not in pulls:
                continue
            plans, weights, scales = self._plans(c, features, pooled=True)
            outs = self._table_outputs(pulls, c.name, plans, weights, group)
            for p, o, scale in zip(plans, outs, scales):
                out[p.feature] = o if scale is None else o * scale[:, None]
        return out


class EmbeddingCollection(_Collection):
    """Unpooled embeddings: forward(features: {name: Bags or 1-D keys}) -> {name: Tensor
    (num_keys, dim)}, one row per key in order (offsets and weights are not used)."""

    def _normalize(self, features):
        if not hasattr(features, "items"):
            raise TypeError("features: expected a mapping of feature name to keys or Bags, "
                            "got %s" % type(features).__name__)
        if all(isinstance(b, Bags) for b in features.values()):
            return features
        return {f: b if isinstance(b, Bags) else Bags(b, lengths=np.ones(len(b), np.int64))
                for f, b in features.items()}

    def forward(self, features):
        original, features = features, self._normalize(features)
        pulls = self._pulls_of(original, features)
        group = self._new_group()
        out = {}
        for c in self.configs:
            if c.name not in pulls:
                continue
            plans, weights, _ = self._plans(c, features, pooled=False)
            for p, o in zip(plans, self._table_outputs(pulls, c.name, plans, weights, group)):
                out[p.feature] = o
        return out


class _DensePull(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, owner, flats):
        ctx.owner = owner
        return tuple(flats)

    @staticmethod
    def backward(ctx, *grads):
        ctx.owner._push(grads)
        return (None, None, None)


class TesseraDense(torch.nn.Module):
    """A torch module whose parameters live in Tessera dense tables, one table per parameter
    (named NAME/PARAM). forward(*args) pulls every parameter, runs `module` with them
    (torch.nn.utils.stateless.functional_call) and its backward pushes their gradients, which
    the tables' optimizer applies. The module's own parameter values are not used: the tables
    start from their initializers (`initializers`: {param name: InitializerSpec}; default
    uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) for tensors of 2 or more dimensions, as
    torch.nn.Linear, and zeros for the others). Pulls and pushes are synchronous, one per
    parameter."""

    def __init__(self, client, name, module, optimizer=None, initializers=None,
                 device="cpu"):
        super().__init__()
        self.client, self.module = client, module
        self.device = torch.device(device)
        self.shapes, self.tables, self.flats = {}, {}, {}  # flats: {name: numel}
        initializers = dict(initializers or {})
        optimizer = optimizer if optimizer is not None else tessera.OptimizerSpec("sgd")
        for i, (pname, p) in enumerate(module.named_parameters()):
            init = initializers.pop(pname, None)
            if init is None:
                if p.dim() >= 2:
                    bound = 1.0 / float(np.sqrt(p.shape[1] * int(np.prod(p.shape[2:]))))
                    init = tessera.InitializerSpec("uniform", a=-bound, b=bound, seed=i + 1)
                else:
                    init = tessera.InitializerSpec("zeros")
            self.tables[pname] = client.create_table(
                tessera.TableSpec.dense("%s/%s" % (name, pname), p.numel(), optimizer, init))
            self.shapes[pname] = tuple(p.shape)
            self.flats[pname] = p.numel()
        if initializers:
            raise ValueError("initializers: no parameter named %s" % sorted(initializers))
        for p in module.parameters():
            p.requires_grad_(False)  # the tables hold the values; no torch optimizer for them
        self._anchor = torch.empty(0, requires_grad=True)

    def _pull_flat(self, name):
        # A fresh buffer per pull: the autograd graph of a step owns its tensors.
        flat = torch.empty(self.flats[name], dtype=torch.float32,
                           pin_memory=self.device.type == "cuda")
        self.client.dense_pull(self.tables[name], out=flat.numpy())
        return flat.to(self.device, non_blocking=True)

    def pull(self):
        """The parameters as the tables hold them now: {name: tensor} (no autograd)."""
        return {n: self._pull_flat(n).view(self.shapes[n]) for n in self.tables}

    def forward(self, *args, **kwargs):
        names = list(self.tables)
        flats = [self._pull_flat(n) for n in names]
        if torch.is_grad_enabled():
            flats = _DensePull.apply(self._anchor, self, flats)
        params = {n: f.view(self.shapes[n]) for n, f in zip(names, flats)}
        return torch.nn.utils.stateless.functional_call(self.module, params, args, kwargs)

    def _push(self, grads):
        for n, g in zip(self.tables, grads):
            if g is None:
                continue
            self.client.dense_push(self.tables[n], g.detach().float().cpu().contiguous().numpy())


class PrefetchLoader:
    """Iterates over `loader` (a DataLoader or any iterable of batches) one batch ahead: before
    yielding batch i it calls module.prefetch(features(batch i+1)), so that batch's pulls are
    in flight while batch i computes (one step stale: see the module docstring).

    features: a function from a batch to the {name: Bags} mapping the module's forward is
    given (the same object); default: the batch itself."""

    def __init__(self, loader, module, features=None):
        self.loader, self.module = loader, module
        self.features = features if features is not None else (lambda b: b)

    def __iter__(self):
        it = iter(self.loader)
        try:
            cur = next(it)
        except StopIteration:
            return
        self.module.prefetch(self.features(cur))
        for nxt in it:
            self.module.prefetch(self.features(nxt))
            yield cur
            cur = nxt
        yield cur

    def __len__(self):
        return len(self.loader)


class _DotInteraction(torch.autograd.Function):
    """dot_interaction on CPU float32 tensors: forward and backward in the compiled core."""

    @staticmethod
    def forward(ctx, dense, sparse):
        dense, sparse = dense.detach().contiguous(), sparse.detach().contiguous()
        n = sparse.shape[1] + 1
        out = torch.empty((dense.shape[0], dense.shape[1] + n * (n - 1) // 2),
                          dtype=torch.float32)
        tessera._tessera.dot_interaction(dense.numpy(), sparse.numpy(), out.numpy())
        ctx.save_for_backward(dense, sparse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        dense, sparse = ctx.saved_tensors
        grad_dense, grad_sparse = torch.empty_like(dense), torch.empty_like(sparse)
        tessera._tessera.dot_interaction_backward(
            grad_out.detach().to(torch.float32).contiguous().numpy(), dense.numpy(),
            sparse.numpy(), grad_dense.numpy(), grad_sparse.numpy())
        return grad_dense, grad_sparse


def dot_interaction(dense, sparse):
    """DLRM's dot interaction: [dense, the dots of every pair of the n = F + 1 vectors].

    dense: (B, d), each sample's dense vector (the bottom MLP's output); sparse: (B, F, d),
    its F pooled fields. Returns (B, d + n(n-1)/2): dense, then <v_i, v_j> for i = 1..n-1,
    j = 0..i-1 (row by row), where v_0 is the dense vector and v_1..v_F the fields: the same
    as torch.cat([dense, torch.bmm(t, t.transpose(1, 2))[:, li, lj]], 1) with t = the n
    vectors stacked and (li, lj) = torch.tril_indices(n, n, -1), and differentiable in both
    inputs. CPU float32 tensors take the compiled core (forward and backward one pass per
    sample); others (CUDA, float64) take that torch expression.
    """
    if not isinstance(dense, torch.Tensor) or not isinstance(sparse, torch.Tensor):
        raise TypeError("dot_interaction: expected torch tensors, got %s and %s" %
                        (type(dense).__name__, type(sparse).__name__))
    if dense.dim() != 2 or sparse.dim() != 3 or sparse.shape[0] != dense.shape[0] or \
            sparse.shape[2] != dense.shape[1]:
        raise ValueError("dot_interaction: expected dense (B, d) and sparse (B, F, d), got %s "
                         "and %s" % (tuple(dense.shape), tuple(sparse.shape)))
    if dense.device != sparse.device or dense.dtype != sparse.dtype:
        raise ValueError("dot_interaction: dense (%s, %s) and sparse (%s, %s) differ in device "
                         "or dtype" % (dense.device, dense.dtype, sparse.device, sparse.dtype))
    if dense.device.type == "cpu" and dense.dtype == torch.float32:
        return _DotInteraction.apply(dense, sparse)
    n = sparse.shape[1] + 1
    li, lj = torch.tril_indices(n, n, offset=-1, device=dense.device)
    t = torch.cat([dense[:, None, :], sparse], 1)
    return torch.cat([dense, torch.bmm(t, t.transpose(1, 2))[:, li, lj]], 1)
