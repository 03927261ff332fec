"""autoopt history: (being written)."""
