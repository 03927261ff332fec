"""autoopt diff: (being written)."""
