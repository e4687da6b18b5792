"""The data plane: models, readiness, deadlines, budgets, batching and warm-up, behind any front.

Nothing here imports a web framework; `aserve.server` is one front over it.
"""

from .engines import resolve_engine
from .models import LOADING, READY, UNAVAILABLE, VERSIONS, ModelHandle, ModelRegistry, make_policy
from .plane import DataPlane
from .stats import Metrics, RequestStats, Tracker, failure_reason

__all__ = [
    "LOADING", "READY", "UNAVAILABLE", "VERSIONS", "DataPlane", "Metrics", "ModelHandle", "ModelRegistry",
    "RequestStats", "Tracker", "failure_reason", "make_policy", "resolve_engine",
]
