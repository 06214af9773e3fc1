"""Repository-wide pytest configuration: the sandbox fixtures for tests/ and e2e/, and how the
property-based tests draw their examples."""

import os

from hypothesis import settings

pytest_plugins = ["tidal.sandbox.pytest_plugin"]

# `make test` and CI draw the same examples every run (a test passes every time or never);
# TIDAL_HYPOTHESIS=explore draws new ones each run, to search wider before a change lands.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("TIDAL_HYPOTHESIS", "ci"))
