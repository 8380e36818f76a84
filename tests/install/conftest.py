"""The install tests run against the same demo cluster and agents as the command-line tests."""

from tests.system.test_cli import demo  # noqa: F401
