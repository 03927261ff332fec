"""autoopt: an agent-driven autotuner for LLM decode paths."""
__version__ = "0.1.0"
