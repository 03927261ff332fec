"""The embedded DeepSeek-V4 decode step as a target: the target (parent side), the worker client, the
worker process, the in-worker measurement and config files. The only package of autoopt that imports
dsv4."""
