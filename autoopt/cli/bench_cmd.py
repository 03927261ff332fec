"""autoopt bench: (being written)."""
