"""autoopt profile: (being written)."""
