"""Targets: what autoopt tunes. `builtin` (dsv4 in a worker process), `replay` (recorded table on a
simulated clock); a `command` target for external servers slots in behind the same protocol."""
