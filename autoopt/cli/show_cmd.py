"""autoopt show: (being written)."""
