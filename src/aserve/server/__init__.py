"""The HTTP front: Open Inference Protocol (V2) and TensorFlow-Serving REST on aiohttp/uvloop."""

from .app import build_app
from .front import Front, FrontRunner
from .serve import Server, serve

__all__ = ["Front", "FrontRunner", "Server", "build_app", "serve"]
