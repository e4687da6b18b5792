"""The HTTP front: Open Inference Protocol (V2) and TensorFlow-Serving REST, on llhttp and uvloop.

`connection.py` parses every request with llhttp; `router.py` matches it against the one
route table (`routes.py`) and decides what its head alone decides; the handlers (`infer.py`,
`v2.py`, `tfserving.py`, `admin.py`, `metrics.py`, `openapi.py`) translate HTTP to the data
plane and back; `serve.py` listens, drains and shuts down.
"""

from .serve import Server, serve

__all__ = ["Server", "serve"]
