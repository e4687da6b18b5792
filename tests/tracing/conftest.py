"""The server fixtures of tests/server, for servers traced here."""

from ..server.conftest import http, repository, start_server  # noqa: F401 - fixtures
