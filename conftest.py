"""Repository-wide pytest configuration: the sandbox fixtures for tests/ and e2e/."""

pytest_plugins = ["tidal.sandbox.pytest_plugin"]
