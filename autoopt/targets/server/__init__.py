"""The `server` target: an OpenAI-compatible inference server (vLLM, SGLang, `transformers serve`, ...)
started per configuration, measured by autoopt's own load generator (autoopt.targets.server.loadgen)."""
