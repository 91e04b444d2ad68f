"""Lattice Python SDK: a client of the Lattice scheduler's REST API.

``LatticeClient`` is async (httpx); ``SyncLatticeClient`` wraps it for scripts and notebooks that do
not run an event loop. Models are dataclasses matching the API's JSON; API errors are exceptions
carrying the HTTP status and the ``field`` the API names.
"""

from .client import LatticeClient, LogLine, WatchEvent
from .errors import (
    LatticeAuthError,
    LatticeConflictError,
    LatticeError,
    LatticeNotFoundError,
    LatticeRateLimitError,
    LatticeValidationError,
)
from .models import (
    Allocation,
    AllocationSpec,
    Dag,
    DataMount,
    Node,
    SubmitResult,
    TaskLaunch,
    Tenant,
    VCluster,
)
from .sync import SyncLatticeClient

__all__ = [
    "Allocation",
    "AllocationSpec",
    "Dag",
    "DataMount",
    "LatticeAuthError",
    "LatticeClient",
    "LatticeConflictError",
    "LatticeError",
    "LatticeNotFoundError",
    "LatticeRateLimitError",
    "LatticeValidationError",
    "LogLine",
    "Node",
    "SubmitResult",
    "SyncLatticeClient",
    "TaskLaunch",
    "Tenant",
    "VCluster",
    "WatchEvent",
]
