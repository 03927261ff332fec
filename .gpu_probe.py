import json, os, random, sys, time
sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "kernels")]
from autoopt.targets.builtin import BuiltinTarget
from autoopt.targets.base import EvalRequest
from autoopt.space import SearchSpace, TargetInfo
out = {}
for name, preset in (("dsv4_flash_decode", "flash-slice"),):
    t0 = time.time()
    t = BuiltinTarget(preset=preset, device="cuda")
    info = TargetInfo.from_target(t)
    s = SearchSpace.load(name, info)
    out[name] = {"params": [p.name for p in s.params], "excluded_knobs": s.excluded_knobs,
                 "excluded_values": {k.name: {str(v): r for v, r in k.excluded.items()} for k in s.knobs if k.excluded},
                 "info_s": time.time() - t0}
    rng = random.Random(0)
    trials = [s.baseline_params()]
    while len(trials) < 3:
        p = {q.name: rng.choice(q.choices) for q in s.params}
        if s.is_feasible(p):
            trials.append(p)
    res = []
    for p in trials:
        cfg = s.params_to_config(p)
        t1 = time.time()
        m = t.evaluate(EvalRequest(config=cfg, concurrency=tuple(s.concurrency), min_samples=6, max_samples=10, time_limit_s=200))
        res.append({"status": m.status, "failure": m.failure and f"{m.failure.kind}: {m.failure.reason[:300]}",
                    "obj": s.objective.value(m), "ci": s.objective.ci(m), "overrides": len(cfg["layer_overrides"]),
                    "wall_s": time.time() - t1, "costs": m.costs_s})
        print(json.dumps(res[-1]), flush=True)
    out[name]["trials"] = res
    t.close()
print(json.dumps(out, indent=1, default=str))
