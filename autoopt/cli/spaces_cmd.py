"""autoopt spaces: (being written)."""
