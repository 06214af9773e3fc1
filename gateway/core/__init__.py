"""The gateway's pure core: routing decisions over typed, frozen views (no I/O, no clock)."""
