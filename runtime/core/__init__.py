"""Pure decision logic of the runtime: no I/O, no clock reads, no GPU or HTTP imports.

Every function here takes the current time as an argument where it needs one, and returns
frozen data that carries a ``reason``.  The imperative shell (batcher, engine cache, backends)
acts on those decisions.
"""
