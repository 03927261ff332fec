"""autoopt run: (being written)."""
