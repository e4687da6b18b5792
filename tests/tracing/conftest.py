"""The server fixtures of tests/server, for servers traced here."""

from ..server.conftest import repository  # noqa: F401 - fixtures
