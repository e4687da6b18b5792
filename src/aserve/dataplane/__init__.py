"""The data plane: models, readiness, deadlines, budgets, batching and warm-up, behind any front.

Nothing here imports a web framework; `aserve.server` is one front over it.
"""

from .engines import resolve_engine
from .models import LOADING, READY, UNAVAILABLE, UNLOADING, ModelHandle, ModelRoutes, make_policy
from .plane import DataPlane
from .registry import LoadFailed, ModelRegistry
from .stats import Metrics, RequestStats, Tracker, failure_reason

__all__ = [
    "LOADING", "READY", "UNAVAILABLE", "UNLOADING", "DataPlane", "LoadFailed", "Metrics", "ModelHandle",
    "ModelRegistry", "ModelRoutes", "RequestStats", "Tracker", "failure_reason", "make_policy", "resolve_engine",
]
