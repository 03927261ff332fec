"""autoopt measure: (being written)."""
