"""autoopt best: (being written)."""
