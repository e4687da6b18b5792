"""The HTTP front: Open Inference Protocol (V2) and TensorFlow-Serving REST on aiohttp/uvloop."""

from .app import build_app
from .engines import resolve_engine
from .models import ModelHandle, ModelRegistry
from .serve import Server, serve

__all__ = ["ModelHandle", "ModelRegistry", "Server", "build_app", "resolve_engine", "serve"]
