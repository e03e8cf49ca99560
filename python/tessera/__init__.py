"""Tessera parameter-server client for Python and PyTorch jobs.

The compiled core (`tessera._tessera`, pybind11) holds the client, the table specs, the errors
and the export reader; this package re-exports all of it, so `tessera.Client`,
`tessera.SparseTableSpec`, `tessera.NotFoundError` ... are what user code names. PyTorch modules
live in `tessera.torch` (imported on demand: `import tessera` does not import torch).
See python/README.md.
"""
from . import _tessera
from ._tessera import *  # noqa: F401,F403  (the public names of the compiled core)

__doc__ = (__doc__ or "") + "\n" + (_tessera.__doc__ or "")
__all__ = [name for name in dir(_tessera) if not name.startswith("_")]
