"""Kernel-level timings of the decode step's Triton kernels on a CUDA GPU.

  PYTHONPATH=kernels:. python3 benchmarks/attention_kernels.py [--out PATH] [--reps 3] [--quick]

Sections (DeepSeek-V4-Flash shapes, bf16 unless said):
  attention  per_head vs mma (several tile configs), B = 1, 16, 64; H=64, D=512, K = 128 window +
             512 selected entries per sequence
  indexer    Triton fp32 / bf16 / fp8 vs torch (fp32 bmm with TF32 off; bf16 bmm cast back to fp32)
             for 64 heads x 128 dims over S=2048 compressed keys
  mhc        pre-norm: Triton split-K (bf16, fp32) vs torch (fp32 mm = SIMT with TF32 off, bf16 mm),
             W = 16384 (Flash) and 28672 (Pro); plus hc_post+hc_pre fused vs torch post + Triton pre

Two timings per variant:
  graph  (the headline) GPU time per call: one call per input set, all captured into one CUDA graph
         and replayed; the sets rotate (together several times the L2) so each call reads cold data,
         as in a real step where 43 layers pass through L2 in between. No Python in the loop.
  eager  triton.testing.do_bench on one set (L2 flushed before each call), launched from Python: it
         includes the wrapper's CPU cost whenever that exceeds the GPU time (small shapes).
Each: --reps runs; median of the run medians, spread [p10, p90] over all samples. Bandwidth counts
the fewest bytes the op must move; MBU is that over the d2d copy bandwidth (an SM copy kernel,
timed eagerly) measured at the start.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import torch

try:
    import triton
    from dsv4 import ref_ops
    from dsv4.triton_attention import sparse_mqa_decode
    from dsv4.triton_indexer import fp8_supported, indexer_scores
    from dsv4.triton_mhc import mhc_post_pre_fused, mhc_prenorm
except ImportError as exc:  # pragma: no cover - reported, not raised
    sys.exit(f"attention_kernels: cannot import the kernels ({exc}); run with PYTHONPATH=kernels:.")

H, D, WINDOW, TOPK = 64, 512, 128, 512
BATCHES = (1, 16, 64)
ROTATE_BYTES = 192 << 20  # input sets per graph: enough to cycle ~3x the 60 MB L2
# (block_kv, heads_per_tile, num_warps, num_stages, split_k)
PER_HEAD = [(16, 1, 4, 2, 1), (32, 1, 4, 2, 1), (64, 1, 4, 2, 1)]
MMA = [(64, 16, 4, 2, 1), (32, 16, 4, 2, 1), (32, 16, 4, 3, 1), (64, 16, 4, 3, 1),
       (32, 16, 4, 2, 2), (32, 16, 4, 3, 4), (64, 16, 4, 2, 4), (16, 16, 4, 3, 8), (32, 16, 4, 3, 8),
       (32, 32, 8, 2, 1), (64, 64, 8, 2, 1), (32, 64, 8, 3, 4), (16, 8, 4, 3, 4)]


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def graph_replays_us(calls: list, replays: int) -> list[float]:
    """GPU microseconds per call of each of `replays` replays of one CUDA graph holding all calls
    (the host's launch cost is not in it). benchmarks/record_kernel_landscape.py times with it too."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch's graph docs ask
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        graph.replay()
        t1.record()
        t1.synchronize()
        samples.append(1e3 * t0.elapsed_time(t1) / len(calls))
    del graph
    return samples


def graph_bench(calls: list, reps: int, replays: int = 10) -> dict:
    """GPU microseconds per call: capture all calls (one per input set) in one CUDA graph."""
    samples = graph_replays_us(calls, reps * replays)
    medians = [statistics.median(samples[i:i + replays]) for i in range(0, len(samples), replays)]
    return {"median_us": statistics.median(medians), "p10_us": quantile(samples, 0.1),
            "p90_us": quantile(samples, 0.9), "run_medians_us": [round(m, 3) for m in medians],
            "calls_per_graph": len(calls)}


def eager_bench(fn) -> dict:
    p10, p50, p90 = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.1, 0.5, 0.9])
    return {"eager_us": 1e3 * p50, "eager_p10_us": 1e3 * p10, "eager_p90_us": 1e3 * p90}


def n_sets(bytes_per_call: int) -> int:
    return max(4, min(256, math.ceil(ROTATE_BYTES / bytes_per_call)))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    fin = torch.isfinite(ref)
    return ((out.double()[fin] - ref.double()[fin]).norm() / ref.double()[fin].norm()).item()


def measure(rows: list, section: str, name: str, calls: list, ref, nbytes: int, ceiling: float,
            reps: int, **extra) -> None:
    """Check calls[0]() against ref (None: no check), time graph + eager, append a row. A variant
    that fails to compile or run is recorded with its error (data, not a crash)."""
    try:
        res = calls[0]()
        err = None if ref is None else rel_err(res[0] if isinstance(res, tuple) else res, ref)
        t = {**graph_bench(calls, reps), **eager_bench(calls[0])}
    except Exception as exc:  # noqa: BLE001 - recorded with its type and message
        rows.append({"section": section, "variant": name, **extra,
                     "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        return
    gbps = nbytes / (t["median_us"] * 1e3)
    rows.append({"section": section, "variant": name, **extra, **t, "rel_err": err,
                 "bytes": nbytes, "GBps": round(gbps, 1), "mbu": round(gbps / ceiling, 3)})


def machine() -> dict:
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    props = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
            "sm_count": props.multi_processor_count, "driver": driver or "unknown",
            "cuda": torch.version.cuda, "torch": torch.__version__, "triton": triton.__version__,
            "python": sys.version.split()[0],
            "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def copy_bandwidth(reps: int) -> dict:
    """Device-to-device copy of 1 GiB, counting bytes read + written: the memory ceiling."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    # eager, not in a graph: a captured copy becomes a memcpy node on the copy engine (seen at
    # ~2.75 TB/s on an H200 against ~4.2 TB/s for the SM copy kernel)
    t = eager_bench(lambda: dst.copy_(src))
    return {"GBps": 2 * src.numel() / (t["eager_us"] * 1e3), **t}


def attention(rows: list, reps: int, ceiling: float, quick: bool) -> None:
    for B in BATCHES:
        nbytes = B * ((WINDOW + TOPK) * (D * 2 + 4) + 2 * H * D * 2)  # rows + idx, q + out
        sets = n_sets(nbytes)
        S = max(WINDOW + TOPK, (256 << 20) // (B * D * 2))  # one 256 MB cache the sets pick from
        kv = torch.randn(B, S, D, device="cuda").bfloat16()
        sink = torch.randn(H, device="cuda")
        qs, idxs = [], []
        for _ in range(sets):
            qs.append(torch.randn(B, H, D, device="cuda").bfloat16())
            start = torch.randint(0, S - WINDOW, (B, 1), device="cuda")
            win = start + torch.arange(WINDOW, device="cuda")  # the sliding window is contiguous
            sel = torch.randint(0, S, (B, TOPK), device="cuda")
            idxs.append(torch.cat([win, sel], 1).to(torch.int32).contiguous())
        ref = ref_ops.sparse_mqa_decode_ref(qs[0], kv, idxs[0], sink, D ** -0.5)
        configs = [("per_head", c) for c in PER_HEAD] + [("mma", c) for c in MMA]
        if quick:
            configs = configs[1:2] + configs[3:5]
        for mode, (bkv, hpt, nw, ns, sk) in configs:
            cfg = dict(mode=mode, block_kv=bkv, heads_per_tile=hpt, num_warps=nw, num_stages=ns,
                       split_k=sk)
            calls = [lambda q=q, idx=idx, cfg=cfg: sparse_mqa_decode(q, kv, idx, sink, D ** -0.5,
                                                                     **cfg)
                     for q, idx in zip(qs, idxs)]
            measure(rows, "attention", f"{mode} kv{bkv} h{hpt} w{nw} s{ns} split{sk}", calls, ref,
                    nbytes, ceiling, reps, B=B, **cfg)
        del kv, qs, idxs


def indexer(rows: list, reps: int, ceiling: float) -> None:
    Hi, Di, S = 64, 128, 2048
    for B in BATCHES:
        lengths = torch.full((B,), S, device="cuda", dtype=torch.int32)
        pos = torch.arange(S, device="cuda")[None, :]
        sets = []
        for _ in range(n_sets(B * (Hi + S) * Di * 4)):
            q, k = torch.randn(B, Hi, Di, device="cuda"), torch.randn(B, S, Di, device="cuda")
            (q8, qs), (k8, ks) = ref_ops.quantize_fp8_rowwise(q), ref_ops.quantize_fp8_rowwise(k)
            sets.append(dict(q=q, k=k, qb=q.bfloat16(), kb=k.bfloat16(), q8=q8, qs=qs, k8=k8, ks=ks,
                             w=torch.rand(B, Hi, device="cuda")))

        def torch_scores(qm, km, w):  # the unfused form: GEMM, fp32 logits, relu, weighted sum
            logits = torch.bmm(qm, km.transpose(1, 2)).float().relu()  # [B, Hi, S]
            return torch.bmm(w[:, None, :], logits)[:, 0].masked_fill(pos >= lengths[:, None],
                                                                      float("-inf"))

        variants = {
            "triton fp32": (lambda s: indexer_scores(s["q"], s["k"], s["w"], lengths, "fp32"), 4, "fp32"),
            "triton bf16": (lambda s: indexer_scores(s["qb"], s["kb"], s["w"], lengths, "bf16"), 2, "bf16"),
            "torch fp32 (tf32 off)": (lambda s: torch_scores(s["q"], s["k"], s["w"]), 4, "fp32"),
            "torch bf16 + cast": (lambda s: torch_scores(s["qb"], s["kb"], s["w"]), 2, "bf16")}
        if fp8_supported(torch.device("cuda")):
            variants["triton fp8 (prequantised)"] = (
                lambda s: indexer_scores(s["q8"], s["k8"], s["w"], lengths, "fp8", q_scale=s["qs"],
                                         k_scale=s["ks"]), 1, "fp8")
        s0 = sets[0]
        for name, (fn, elem, mode) in variants.items():
            ref = ref_ops.indexer_scores_ref(s0["q"], s0["k"], s0["w"], lengths, mode)
            calls = [lambda s=s, fn=fn: fn(s) for s in sets]
            measure(rows, "indexer", name, calls, ref, B * ((Hi + S) * Di * elem + S * 4), ceiling,
                    reps, B=B)


def mhc(rows: list, reps: int, ceiling: float) -> None:
    M = 24

    def torch_pre(x, hc):
        r = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return (x @ hc.T).float() * r

    for W in (16384, 28672):
        for T in BATCHES:
            sets = []
            for _ in range(n_sets((T + M) * W * 4)):
                xb, hb = torch.randn(T, W, device="cuda").bfloat16(), torch.randn(M, W, device="cuda").bfloat16()
                sets.append(dict(xb=xb, hb=hb, xf=xb.float(), hf=hb.float(),
                                 out=torch.randn(T, W // 4, device="cuda").bfloat16(),
                                 post=torch.rand(T, 4, device="cuda"), comb=torch.rand(T, 4, 4, device="cuda")))
            s0 = sets[0]
            for name, fn, elem, xk, hk in (
                    ("triton bf16", lambda s: mhc_prenorm(s["xb"], s["hb"]), 2, "xb", "hb"),
                    ("triton fp32", lambda s: mhc_prenorm(s["xf"], s["hf"]), 4, "xf", "hf"),
                    ("torch fp32 mm (tf32 off)", lambda s: torch_pre(s["xf"], s["hf"]), 4, "xf", "hf"),
                    ("torch bf16 mm", lambda s: torch_pre(s["xb"], s["hb"]), 2, "xb", "hb")):
                measure(rows, "mhc_prenorm", name, [lambda s=s, fn=fn: fn(s) for s in sets],
                        ref_ops.mhc_prenorm_ref(s0[xk], s0[hk]), (T + M) * W * elem, ceiling, reps,
                        T=T, W=W)

            def fused(s):  # hc_post of one sublayer + hc_pre of the next, bf16 residual
                return mhc_post_pre_fused(s["xb"].view(T, 4, W // 4), s["out"], s["post"], s["comb"],
                                          s["hb"])

            def unfused(s):
                new = (s["post"][:, :, None] * s["out"].float()[:, None, :]
                       + torch.einsum("tij,tid->tjd", s["comb"], s["xb"].view(T, 4, -1).float()))
                new = new.bfloat16()
                return new, mhc_prenorm(new.view(T, W), s["hb"])

            nbytes = (2 * T * W + T * W // 4 + M * W) * 2
            ref_new = unfused(s0)[0]
            for name, fn in (("post+pre fused (triton)", fused), ("torch post + triton pre", unfused)):
                measure(rows, "mhc_post_pre", name, [lambda s=s, fn=fn: fn(s) for s in sets], ref_new,
                        nbytes, ceiling, reps, T=T, W=W)


def print_tables(rows: list) -> None:
    for section in ("attention", "indexer", "mhc_prenorm", "mhc_post_pre"):
        sel = [r for r in rows if r["section"] == section]
        if not sel:
            continue
        print(f"\n== {section} ==  (graph: GPU us/call, cold L2; eager: do_bench from Python)")
        print(f"{'variant':34s} {'shape':>13s} {'graph us':>9s} {'[p10, p90]':>15s} {'GB/s':>6s} "
              f"{'MBU':>5s} {'eager us':>9s} {'rel err':>8s}")
        for r in sel:
            shape = f"B={r['B']}" if "B" in r else f"T={r['T']} W={r['W']}"
            if "error" in r:
                print(f"{r['variant']:34s} {shape:>13s}  FAILED {r['error'][:90]}")
                continue
            spread = f"[{r['p10_us']:.1f}, {r['p90_us']:.1f}]"
            err = "-" if r.get("rel_err") is None else f"{r['rel_err']:.1e}"
            print(f"{r['variant']:34s} {shape:>13s} {r['median_us']:9.1f} {spread:>15s} "
                  f"{r['GBps']:6.0f} {r['mbu']:5.2f} {r['eager_us']:9.1f} {err:>8s}")


def attention_summary(rows: list) -> dict:
    """Per batch: best mma vs the per_head knob default (block_kv 64) and vs the best per_head."""
    out = {}
    for B in BATCHES:
        ok = [r for r in rows if r["section"] == "attention" and r.get("B") == B and "error" not in r]
        ph = [r for r in ok if r["mode"] == "per_head"]
        mma = [r for r in ok if r["mode"] == "mma"]
        if not ph or not mma:
            continue
        best_mma = min(mma, key=lambda r: r["median_us"])
        best_ph = min(ph, key=lambda r: r["median_us"])
        default_ph = next((r for r in ph if r["block_kv"] == 64), best_ph)
        default_mma = next((r for r in mma if r["variant"] == "mma kv64 h16 w4 s2 split1"), best_mma)
        out[f"B={B}"] = {
            "best_mma": best_mma["variant"], "best_mma_us": best_mma["median_us"],
            "best_per_head": best_ph["variant"], "best_per_head_us": best_ph["median_us"],
            "speedup_vs_best_per_head": round(best_ph["median_us"] / best_mma["median_us"], 2),
            "speedup_vs_default_per_head": round(default_ph["median_us"] / best_mma["median_us"], 2),
            "default_mma_speedup_vs_default_per_head":
                round(default_ph["median_us"] / default_mma["median_us"], 2)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default "
                    "benchmarks/results/attention_kernels_<gpu>.json)")
    ap.add_argument("--reps", type=int, default=3, help="timing runs per figure (spread)")
    ap.add_argument("--quick", action="store_true", help="three attention configs only")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_kernels: needs a CUDA GPU (Triton kernels are timed on the device)")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # "fp32" must mean fp32, not TF32
    torch.manual_seed(0)
    info = machine()
    ceiling = copy_bandwidth(args.reps)
    print(f"{info['gpu']} sm_{''.join(map(str, info['capability']))} driver {info['driver']} "
          f"torch {info['torch']} triton {info['triton']}; d2d copy {ceiling['GBps']:.0f} GB/s")
    gpu = info["gpu"].lower().replace("nvidia", "").strip().replace(" ", "_") or "gpu"
    out = args.out or Path(__file__).parent / "results" / f"attention_kernels_{gpu}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list = []
    summary: dict = {}
    for section in (lambda: attention(rows, args.reps, ceiling["GBps"], args.quick),
                    lambda: indexer(rows, args.reps, ceiling["GBps"]),
                    lambda: mhc(rows, args.reps, ceiling["GBps"])):
        n_before = len(rows)
        section()
        summary = attention_summary(rows)
        out.write_text(json.dumps({  # after every section: a run cut short keeps its figures
            "machine": info, "copy_ceiling": ceiling, "timing": __doc__.split("Two timings")[1],
            "attention_summary": summary, "rows": rows}, indent=1))
        print_tables(rows[n_before:])
        torch.cuda.empty_cache()
    print("\n== mma vs per_head (kernel level, graph timing; issue target: >= 2.2x at B=16) ==")
    for key, s in summary.items():
        print(f"{key:5s} best mma {s['best_mma']} {s['best_mma_us']:.1f} us; "
              f"x{s['speedup_vs_best_per_head']} vs best per_head ({s['best_per_head']}), "
              f"x{s['speedup_vs_default_per_head']} vs per_head kv64; knob defaults (mma kv64 h16 "
              f"vs per_head kv64) x{s['default_mma_speedup_vs_default_per_head']}")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
