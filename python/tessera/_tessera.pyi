"""Type stubs of tessera._tessera, the compiled core of the `tessera` package (python/*.cc).

python/tests/test_stubs.py keeps them in step with the module: every public name, method,
property and parameter of the built module is here, and nothing that the module lacks.
"""

from typing import Any, ClassVar, Sequence

import numpy as np
import numpy.typing as npt

# uint64 keys: C-contiguous uint64 arrays are read in place; other integer arrays, lists and
# int64 torch tensors are converted once (negative keys: ValueError; floats: TypeError).
_Keys = npt.ArrayLike
# float32 gradients (other float dtypes converted once; integer or bool: TypeError).
_Grads = npt.ArrayLike
# An output array written in place: float32, C-contiguous, writable (an ndarray or CPU tensor).
_Out = Any
_Rows = npt.NDArray[np.float32]
_TableRef = Table | str

# ---------------------------------------------------------------- errors (errors.cc)

class Error(RuntimeError):
    """A Tessera call failed; `code` names the Status code."""

    code: str
    message: str

class InvalidArgumentError(Error, ValueError): ...
class NotFoundError(Error, LookupError): ...
class AlreadyExistsError(Error): ...
class UnavailableError(Error, ConnectionError): ...
class DeadlineExceededError(Error, TimeoutError): ...
class CorruptionError(Error): ...
class IOError(Error, OSError): ...
class ResourceExhaustedError(Error): ...
class InternalError(Error): ...
class FailedPreconditionError(Error): ...
class CancelledError(Error): ...
class PermissionDeniedError(Error, PermissionError): ...
class AbortedError(Error): ...

# ---------------------------------------------------------------- specs (specs.cc)

class _Enum:
    """A pybind11 enum: compares and hashes by value; int(x) is the value."""

    __members__: ClassVar[dict[str, Any]]
    def __init__(self, value: int) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...
    def __ne__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class TableKind(_Enum):
    SPARSE: ClassVar[TableKind]
    DENSE: ClassVar[TableKind]

class OptimizerKind(_Enum):
    SGD: ClassVar[OptimizerKind]
    MOMENTUM: ClassVar[OptimizerKind]
    ADAGRAD: ClassVar[OptimizerKind]
    ROWWISE_ADAGRAD: ClassVar[OptimizerKind]
    ADAM: ClassVar[OptimizerKind]
    FTRL: ClassVar[OptimizerKind]

class InitializerKind(_Enum):
    ZEROS: ClassVar[InitializerKind]
    CONSTANT: ClassVar[InitializerKind]
    UNIFORM: ClassVar[InitializerKind]
    NORMAL: ClassVar[InitializerKind]

class OptimizerSpec:
    """Server-side optimizer of a table: 'sgd', 'momentum', 'adagrad', 'rowwise_adagrad',
    'adam' or 'ftrl' (or an OptimizerKind)."""

    kind: OptimizerKind
    learning_rate: float
    momentum: float
    beta1: float
    beta2: float
    epsilon: float
    initial_accumulator: float
    ftrl_beta: float
    l1: float
    l2: float
    def __init__(
        self,
        kind: str | OptimizerKind = "sgd",
        learning_rate: float = 0.01,
        momentum: float = 0.9,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        initial_accumulator: float = 0.0,
        ftrl_beta: float = 1.0,
        l1: float = 0.0,
        l2: float = 0.0,
    ) -> None: ...

class InitializerSpec:
    """First value of a row or dense element: 'zeros', 'constant' (a), 'uniform' (in [a, b])
    or 'normal' (mean a, stddev b)."""

    kind: InitializerKind
    a: float
    b: float
    seed: int
    def __init__(
        self, kind: str | InitializerKind = "zeros", a: float = 0.0, b: float = 0.0, seed: int = 0
    ) -> None: ...

class AdmissionSpec:
    """A key gets a stored row after min_count pushes, with probability."""

    min_count: int
    probability: float
    def __init__(self, min_count: int = 0, probability: float = 1.0) -> None: ...

class EvictionSpec:
    """Rows idle this long are deleted (0: never)."""

    max_idle_steps: int
    max_idle_seconds: int
    def __init__(self, max_idle_steps: int = 0, max_idle_seconds: int = 0) -> None: ...

class TableSpec:
    """What a table is: TableSpec.sparse(name, dim, ...) or TableSpec.dense(name, length, ...)."""

    name: str
    kind: TableKind
    dim: int
    length: int
    optimizer: OptimizerSpec
    initializer: InitializerSpec
    admission: AdmissionSpec
    eviction: EvictionSpec
    @staticmethod
    def sparse(
        name: str,
        dim: int,
        optimizer: OptimizerSpec = ...,
        initializer: InitializerSpec = ...,
        admission: AdmissionSpec | None = None,
        eviction: EvictionSpec | None = None,
    ) -> TableSpec: ...
    @staticmethod
    def dense(
        name: str,
        length: int,
        optimizer: OptimizerSpec = ...,
        initializer: InitializerSpec = ...,
    ) -> TableSpec: ...
    def validate(self) -> None:
        """Raises InvalidArgumentError when the spec is malformed."""
    def difference(self, other: TableSpec) -> str:
        """Empty when equal, else the differences, e.g. 'dim: 16 vs 32'."""
    def __eq__(self, other: object) -> bool: ...

class Table:
    """A table known to the client (create_table, get_table)."""

    @property
    def id(self) -> int: ...
    @property
    def spec(self) -> TableSpec: ...
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> TableKind: ...
    @property
    def dim(self) -> int: ...
    @property
    def length(self) -> int: ...

# ---------------------------------------------------------------- client (client*.cc)

class Future:
    """An asynchronous call; dropping an unfinished Future cancels it."""

    def wait(self, timeout_ms: int | None = None) -> _Rows | None:
        """The output array of a pull (None for a push); raises on an error. A timeout raises
        DeadlineExceededError and leaves the call in flight."""
    def done(self) -> bool: ...
    def cancel(self) -> None: ...

class Client:
    """A connection to a Tessera cluster. Thread-safe; every wait releases the GIL.

    `cluster`: "host:port,host:port", a list of endpoints, "@FILE", or "etcd://HOST:PORT/PREFIX"
    (the cluster map in etcd names the servers).
    """

    def __init__(
        self,
        cluster: str | Sequence[str],
        *,
        worker_id: int = 0,
        num_workers: int = 0,
        staleness: int = -1,
        request_timeout_ms: int = 60000,
        retry_for_ms: int = 120000,
        connect_timeout_ms: int = 10000,
        curve_server_key: str = "",
        curve_client_secret_key: str = "",
        admin_root: str = "",
    ) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Client: ...
    def __exit__(self, *args: object) -> None: ...
    @property
    def num_servers(self) -> int: ...
    @property
    def servers(self) -> list[str]: ...
    @property
    def worker_id(self) -> int: ...
    @property
    def cluster_map_version(self) -> int: ...
    @property
    def stale_map_retries(self) -> int: ...
    # tables
    def create_table(self, spec: TableSpec, timeout_ms: int | None = None) -> Table: ...
    def get_table(self, name: str, timeout_ms: int | None = None) -> Table: ...
    def drop_table(self, name: str, timeout_ms: int | None = None) -> None: ...
    # sparse data: rows have shape keys.shape + (dim,)
    def pull(
        self, table: _TableRef, keys: _Keys, out: _Out | None = None,
        timeout_ms: int | None = None,
    ) -> _Rows: ...
    def pull_async(self, table: _TableRef, keys: _Keys, out: _Out | None = None) -> Future: ...
    def push(
        self, table: _TableRef, keys: _Keys, grads: _Grads, timeout_ms: int | None = None
    ) -> None: ...
    def push_async(self, table: _TableRef, keys: _Keys, grads: _Grads) -> Future: ...
    def push_pull(
        self, table: _TableRef, keys: _Keys, grads: _Grads, out: _Out | None = None,
        timeout_ms: int | None = None,
    ) -> _Rows: ...
    # dense data: 1-D float32
    def dense_pull(
        self, table: _TableRef, offset: int = 0, length: int | None = None,
        out: _Out | None = None, timeout_ms: int | None = None,
    ) -> _Rows: ...
    def dense_push(
        self, table: _TableRef, grads: _Grads, offset: int = 0, timeout_ms: int | None = None
    ) -> None: ...
    # clocks, learning-rate scale, barriers
    def clock(self, timeout_ms: int | None = None) -> int: ...
    @property
    def current_clock(self) -> int: ...
    def set_clock(self, clock: int, timeout_ms: int | None = None) -> None: ...
    def set_learning_rate_scale(self, scale: float) -> None: ...
    @property
    def learning_rate_scale(self) -> float: ...
    def barrier(self, name: str, timeout_ms: int | None = None) -> None: ...
    # metadata records, stats
    def put_meta(
        self, name: str, value: bytes | str, timeout_ms: int | None = None
    ) -> None: ...
    def get_meta(self, name: str, timeout_ms: int | None = None) -> bytes | None: ...
    def server_stats(
        self, rank: int = 0, timeout_ms: int | None = None
    ) -> dict[str, int | float | str]: ...
    # admin (servers started with --admin_root)
    def checkpoint(self, dir: str, timeout_ms: int | None = None) -> int: ...
    def restore(self, dir: str, timeout_ms: int | None = None) -> None: ...
    def export(self, root: str, delta: bool = False, timeout_ms: int | None = None) -> int: ...

# ---------------------------------------------------------------- export reader (export_reader.cc)

def latest_export_version(root: str) -> int:
    """The latest complete export version under `root` (0 when there is none)."""

class ExportReader:
    """A serving export loaded into memory (no server needed). Immutable: lookups from any
    number of threads."""

    def __init__(self, root: str, version: int = 0) -> None: ...
    @staticmethod
    def open(root: str, version: int = 0) -> ExportReader: ...
    @property
    def version(self) -> int: ...
    def tables(self) -> list[str]: ...
    def spec(self, table: str) -> TableSpec: ...
    def lookup(self, table: str, keys: _Keys, out: _Out | None = None) -> _Rows: ...
    def dense_read(
        self, table: str, offset: int = 0, length: int | None = None, out: _Out | None = None
    ) -> _Rows: ...
    def row_count(self, table: str) -> int: ...

# ---------------------------------------------------------------- bag kernels (bags.cc)
# tessera.torch's CPU kernels. Arrays are C-contiguous numpy arrays (CPU tensors via .numpy())
# of exactly the dtype named, read or written in place: anything else is a TypeError, a wrong
# shape, bound or index a ValueError.

def unique_keys(
    keys: npt.NDArray[np.uint64],
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """(unique, inverse): the distinct keys in increasing order and each key's index into
    them, so that unique[inverse] == keys."""

def bag_sum(
    rows: npt.NDArray[np.float32],
    inverse: npt.NDArray[np.int64],
    bounds: npt.NDArray[np.int64] | None,
    weights: npt.NDArray[np.float32] | None,
    out: npt.NDArray[np.float32],
) -> None:
    """out[j] = sum of weights[i] * rows[inverse[i]] over bag j's values
    bounds[j] <= i < bounds[j + 1] (bounds None: bag j is value j; weights None: 1).
    out (num_bags, dim) is overwritten; an empty bag is zeros."""

def bag_sum_backward(
    grad_out: npt.NDArray[np.float32],
    inverse: npt.NDArray[np.int64],
    bounds: npt.NDArray[np.int64] | None,
    weights: npt.NDArray[np.float32] | None,
    grad_rows: npt.NDArray[np.float32],
) -> None:
    """bag_sum's backward: grad_rows[inverse[i]] += weights[i] * grad_out[bag of i] for every
    value i (added to, not cleared)."""

def dot_interaction(
    dense: npt.NDArray[np.float32],
    sparse: npt.NDArray[np.float32],
    out: npt.NDArray[np.float32],
) -> None:
    """DLRM's dot interaction: out (B, d + n(n-1)/2), n = F + 1, gets [dense, <v_i, v_j> for
    i = 1..n-1, j = 0..i-1] of dense (B, d) and sparse (B, F, d) (v_0: the dense row)."""

def dot_interaction_backward(
    grad_out: npt.NDArray[np.float32],
    dense: npt.NDArray[np.float32],
    sparse: npt.NDArray[np.float32],
    grad_dense: npt.NDArray[np.float32],
    grad_sparse: npt.NDArray[np.float32],
) -> None:
    """dot_interaction's backward: grad_dense (B, d) and grad_sparse (B, F, d) overwritten."""
