"""Criteo-shaped generated data with a planted model: a NumPy port of worker/synthetic_data.cc.

Same seed and options, same samples: the generator is a pure function of (seed, stream, sample
index) built from splitmix64 and Mix64, so this port reproduces the C++ reader's samples (keys,
dense features, labels and true click probabilities) up to the last bits of libm's log/cos,
vectorized over a block of samples. See worker/synthetic_data.h for the model:

  logit = offset + sum_j w_j (x_j - 1) + sum_f b(f, id_f) + sum_{f<g} <v(f, id_f), v(g, id_g)>
"""

import numpy as np

U64 = np.uint64
GOLDEN = U64(0x9E3779B97F4A7C15)

# Criteo's Kaggle cardinalities and per-field missing rates (worker/synthetic_data.cc).
CRITEO_CARD = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
               27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
CRITEO_MISSING = [0.0, 0.0, 0.03, 0.03, 0.0, 0.1, 0.0, 0.0, 0.0, 0.03, 0.0, 0.03, 0.0, 0.0, 0.0,
                  0.03, 0.0, 0.0, 0.44, 0.44, 0.03, 0.0, 0.0, 0.03, 0.44, 0.03]
FIELD_BITS = 8
VALUE_MASK = U64((1 << (64 - FIELD_BITS)) - 1)


def mix64(k):
    """ps/routing.h Mix64 on uint64 arrays (wrapping arithmetic)."""
    k = np.array(k, dtype=U64)  # a copy: updated in place below (fewer temporaries)
    with np.errstate(over="ignore"):
        k ^= k >> U64(33)
        k *= U64(0xFF51AFD7ED558CCD)
        k ^= k >> U64(33)
        k *= U64(0xC4CEB9FE1A85EC53)
        k ^= k >> U64(33)
    return k


def hash3(a, b, c):
    a, b, c = (np.asarray(x, dtype=U64) for x in (a, b, c))
    with np.errstate(over="ignore"):
        return mix64(mix64(a ^ U64(0x243F6A8885A308D3)) ^ mix64(b + U64(0x13198A2E03707344)) ^
                     (c * U64(0xA4093822299F31D0) + U64(0x082EFA98EC4E6C89)))


def unit(h):
    return ((h >> U64(11)).astype(np.float64) + 0.5) * 2.0 ** -53


def normal(h1, h2):
    return np.sqrt(-2.0 * np.log(unit(h1))) * np.cos(2.0 * np.pi * unit(h2))


def make_key(field, value):
    """ps/feature_keys.h MakeKey: the field in the top 8 bits, a 56-bit hash of the value below."""
    f = U64(field)
    with np.errstate(over="ignore"):
        return (f << U64(64 - FIELD_BITS)) | (mix64(value ^ (f * GOLDEN)) & VALUE_MASK)


def _helper_log(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.abs(x) > 1e-8, np.log1p(x) / x, 1 - x / 2)


def _helper_exp(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.abs(x) > 1e-8, np.expm1(x) / x, 1 + x / 2)


def _h_integral(x, s):
    lx = np.log(x)
    return _helper_exp((1 - s) * lx) * lx


def _h(x, s):
    return np.exp(-s * np.log(x))


def _h_integral_inverse(x, s):
    t = np.maximum(x * (1 - s), -1.0)
    return np.exp(_helper_log(t) * x)


def _distinct(ranks, card):
    """(the distinct values of `ranks` in increasing order, each rank's index into them), as
    np.unique(ranks, return_inverse=True); ranks lie in [1, card]. A table of card + 1 entries
    where that is not much larger than the block (no sort), else np.unique."""
    if card > 4 * len(ranks) + 65536:
        uniq, at = np.unique(ranks, return_inverse=True)
        return uniq, at.ravel()
    seen = np.zeros(card + 1, bool)
    seen[ranks] = True
    uniq = np.flatnonzero(seen)
    where = np.empty(card + 1, np.int64)
    where[uniq] = np.arange(len(uniq))
    return uniq.astype(U64), where[ranks]


class Rng:
    """splitmix64 per sample: the k-th draw of a sample is Mix64(state0 + k * GOLDEN)."""

    def __init__(self, state0):
        self.state = state0.copy()

    def next(self, mask=None):
        with np.errstate(over="ignore"):
            if mask is None:
                self.state += GOLDEN
                return mix64(self.state)
            self.state[mask] += GOLDEN
            return mix64(self.state[mask])


class SyntheticData:
    """Generates samples of stream `stream` (0: training, 1: test in the C++ worker)."""

    def __init__(self, seed=1, num_dense=13, max_cardinality=20000, zipf_exponent=1.2,
                 planted_dim=4, interaction_std=0.15, bias_std=1.0, dense_std=0.5,
                 tail_rank=100.0, offset=-1.2):
        self.seed = seed
        self.num_dense = num_dense
        self.card = [min(c, max(max_cardinality, 1)) for c in CRITEO_CARD]
        self.num_fields = len(self.card)
        self.s = zipf_exponent
        self.k = planted_dim
        self.tail_rank = tail_rank
        self.offset = offset
        s = self.s
        self.h_x1 = float(_h_integral(1.5, s) - 1.0)
        self.h_n = [float(_h_integral(n + 0.5, s)) for n in self.card]
        self.s_param = float(2.0 - _h_integral_inverse(_h_integral(2.5, s) - _h(2.0, s), s))
        nf = self.num_fields
        pairs = nf * (nf - 1) / 2.0
        self.sigma_v = (interaction_std ** 2 / (pairs * planted_dim)) ** 0.25 if pairs else 0.0
        self.sigma_b = bias_std / np.sqrt(nf)
        j = np.arange(num_dense, dtype=U64)
        self.dense_w = (normal(hash3(seed, U64(1000) + j, 1), hash3(seed, U64(1000) + j, 2)) *
                        dense_std / np.sqrt(num_dense))

    def _zipf(self, f, rng):
        n, s = self.card[f], self.s
        out = np.zeros(rng.state.shape, dtype=U64)
        todo = np.ones(rng.state.shape, dtype=bool)
        while todo.any():
            u = self.h_n[f] + unit(rng.next(todo)) * (self.h_x1 - self.h_n[f])
            x = _h_integral_inverse(u, s)
            k = np.clip(np.floor(x + 0.5), 1, n)
            ok = (k - x <= self.s_param) | (u >= _h_integral(k + 0.5, s) - _h(k, s))
            idx = np.flatnonzero(todo)
            out[idx[ok]] = k[ok].astype(U64)
            todo[idx[ok]] = False
        return out

    def generate(self, stream, first, count):
        """Samples first .. first+count-1 of `stream` as a dict of arrays:
        dense (count, num_dense) float32, keys (count, num_fields) uint64, present (count,
        num_fields) bool (absent fields have key 0 and contribute nothing), labels and
        true_probs (count,) float32."""
        index = np.arange(first, first + count, dtype=U64)
        rng = Rng(hash3(self.seed, U64(stream) + U64(0x51ED270B), index))
        logit = np.full(count, self.offset)
        dense = np.empty((count, self.num_dense), np.float32)
        for j in range(self.num_dense):
            # Heavy-tailed non-negative features, like log(1 + count). GCC evaluates the two
            # Next() arguments of Normal right to left: the second draw is h1.
            h2 = rng.next()
            h1 = rng.next()
            x = np.log1p(np.exp(1.5 * normal(h1, h2)))
            dense[:, j] = x
            logit += self.dense_w[j] * (x - 1.0)
        nf, k = self.num_fields, self.k
        keys = np.zeros((count, nf), U64)
        present = np.zeros((count, nf), bool)
        vsum = np.zeros((count, k))
        vsq = np.zeros(count)
        seed = U64(self.seed)
        for f in range(nf):
            present[:, f] = unit(rng.next()) >= CRITEO_MISSING[f]
            # A key's id, bias and planted vector depend on (field, rank) alone, and Zipf ranks
            # repeat: each is computed once per distinct rank of the block (the same values,
            # elementwise, as per sample) and gathered.
            rank, at = _distinct(self._zipf(f, rng), self.card[f])
            with np.errstate(over="ignore"):
                ident = mix64(rank * GOLDEN + U64(f)) & U64(0xFFFFFFFFFF)
            keys[:, f] = np.where(present[:, f], make_key(f, ident)[at], U64(0))
            decay = (1.0 / np.sqrt(1.0 + (rank - U64(1)).astype(np.float64) / self.tail_rank)
                     if self.tail_rank > 0 else np.ones(len(rank)))
            p = present[:, f]
            base = rank * U64(64)
            bias = decay * self.sigma_b * normal(hash3(seed, f, base + U64(62)),
                                                 hash3(seed, f, base + U64(63)))
            logit += np.where(p, bias[at], 0.0)
            for d in range(min(k, 8)):
                v = np.sqrt(decay) * self.sigma_v * normal(hash3(seed, f, base + U64(2 * d)),
                                                           hash3(seed, f, base + U64(2 * d + 1)))
                v = np.where(p, v[at], 0.0)
                vsum[:, d] += v
                vsq += v * v
        # sum_{f<g} <v_f, v_g> = (|sum_f v_f|^2 - sum_f |v_f|^2) / 2
        logit += 0.5 * ((vsum * vsum).sum(axis=1) - vsq)
        prob = 1.0 / (1.0 + np.exp(-logit))
        labels = (unit(rng.next()) < prob).astype(np.float32)
        return {"dense": dense, "keys": keys, "present": present, "labels": labels,
                "true_probs": prob.astype(np.float32)}
