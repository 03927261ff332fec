"""The cost-aware, profile-guided agent (`--strategy agent`, the default; registered by
autoopt.search.registry).

Modules: view (the space as integer codes), buckets (learned bucket speed-ups, Amdahl), model (GP of
the gain), propose (sampler / profile / neighbour candidates), choose (expected gain per second of
the one cost model's estimate, autoopt.search.cost; batched builds), noise (repeats until a win clears
the noise), stop (is the next trial worth it?), diagnosis (predicted vs actual, bucket diff),
strategy. Nothing here imports torch.
"""
