"""DecodeSession: a built decode step that the worker measures, reconfigures and resets.

    sess = DecodeSession(preset("tiny"), device="cpu", batch=4)
    tokens = sess.step()          # [B] int64 greedy tokens; sess.last_logits [B, vocab] fp32
    sess.reconfigure(cfg2)        # -> "none" | "recompile" | "rebuild" (the work actually done)
    sess.reset()                  # caches back to the prefilled state
    sess.what_ran()               # what actually ran, per op and layer class

Static buffers (tokens, logits, caches, position) are allocated once, so with cuda_graphs=on the
whole step is captured into a torch.cuda.CUDAGraph and replayed. TF32 is switched off process-wide
(torch.backends.cuda.matmul.allow_tf32 = False) so that "fp32" GEMMs are real fp32 (SIMT), as in the
case study; what_ran records it.

Triton variants (attention tiles, indexer_kernel, mhc_kernel, mhc_fuse_post_pre,
moe_experts=triton_grouped, glue=triton) are CUDA only; the first configuration that launches a
kernel specialisation runs one warm-up step to JIT it (reconfigure returns "recompile"), then resets.

Test hook: DSV4_TEST_BREAK=<op>[,<op>] (attention | indexer | mhc | moe), read when a session is
built, perturbs that op's output so the correctness guard must answer "wrong". what_ran says so.
"""
from __future__ import annotations

import dataclasses
import os

import torch

from dsv4.cache import DecodeCache
from dsv4.config import DecodeConfig
from dsv4.device import capabilities, device_info
from dsv4.glue import Glue, make_glue, raise_recompile_limit, specialize_int_inputs
from dsv4.knobs import KNOB_BY_NAME, KNOBS, unmet_requirement
from dsv4.model import BREAKABLE_OPS, ModelState, decode_forward, make_plans
from dsv4.sections import section
from dsv4.specialisations import model_triton_keys
from dsv4.weights import ModelWeights

BREAK_ENV = "DSV4_TEST_BREAK"
DEFAULT_MAX_NEW_TOKENS = 128
SHAPE_FIELDS = tuple(f.name for f in dataclasses.fields(DecodeConfig)
                     if f.name not in KNOB_BY_NAME and f.name != "layer_overrides")


def _knob_values(cfg: DecodeConfig, name: str) -> set:
    return {cfg.knob(name, None)} | {cfg.knob(name, i) for i in range(cfg.n_layers)}


def check_supported(cfg: DecodeConfig, device: str) -> None:
    """ValueError naming the knob when `cfg` asks for a value this device cannot run. A knob whose
    every value has the same unmet requirement (the Triton tile knobs on a CPU) is inert here."""
    caps = capabilities(device)
    for knob in KNOBS:
        reqs = {knob.requires.get(v) for v in knob.values}
        if len(reqs) == 1 and None not in reqs and unmet_requirement(reqs.pop(), caps):
            continue  # not applicable on this device at all
        for value in _knob_values(cfg, knob.name):
            req = knob.requires.get(value)
            reason = unmet_requirement(req, caps) if req else None
            if reason:
                raise ValueError(f"{knob.name}={value} cannot run on {device}: {reason}")


def _argmax_chunks(vocab: int) -> int:
    """The most chunks <= 256 of >= 256 entries that divide the vocab evenly (1: none)."""
    for chunks in range(min(256, vocab // 256), 1, -1):
        if vocab % chunks == 0:
            return chunks
    return 1


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """logits [B, V] -> [B] int64, exactly logits.argmax(-1) (the first maximum), as a two-stage
    reduction: a max per chunk of the vocab, then the best chunk. One program per row (what eager
    argmax and Inductor's fused argmax launch at B=1) walks 129k logits serially: 22-28 us."""
    B, V = logits.shape
    chunks = _argmax_chunks(V)
    if chunks == 1:
        return logits.argmax(dim=-1)
    vals, idx = logits.view(B, chunks, V // chunks).max(dim=-1)  # [B, chunks]: first max in each
    best = vals.argmax(dim=-1)  # [B]: the first chunk holding the overall maximum
    return best * (V // chunks) + idx.gather(1, best[:, None]).squeeze(1)


def decode_and_sample(st: ModelState, tokens: torch.Tensor, last_logits: torch.Tensor) -> dict:
    """One step: decode_forward, then greedy sampling in place. tokens [B] int64 (this step's input,
    overwritten with the next), last_logits [B, vocab] fp32 (overwritten). Returns what ran.
    Sampling belongs to the compiled region too: Inductor fuses the fp32 logits copy with a split
    argmax over the vocab (eager: a copy plus a one-block argmax of ~28 us at B=1 on the H200)."""
    logits, ran = decode_forward(st, tokens)
    with section("sample"):
        last_logits.copy_(logits)
        tokens.copy_(greedy_tokens(logits))
    return ran


STEP_COMPILE_DESCRIPTIONS = {
    "off": "off",
    "inductor": ("torch.compile(decode_and_sample), Inductor default mode: the torch code between "
                 "Triton kernels fused, greedy sampling included; Triton kernels opaque (graph "
                 "breaks)"),
}
STEP_COMPILE_RECOMPILE_LIMIT = 1024  # one Dynamo entry per configuration (x batch 1 / other)


def step_function(cfg: DecodeConfig):
    """decode_and_sample, or its torch.compile'd form for step_compile=inductor."""
    if cfg.step_compile == "off":
        return decode_and_sample
    loops = sorted({i for i in range(cfg.n_layers) if cfg.knob("moe_experts", i) == "loop"})
    if loops:  # its host-read counts specialise the graph: a recompile at nearly every step
        raise ValueError(f"step_compile=inductor cannot compile moe_experts=loop (layers {loops}): "
                         f"the loop reads expert counts on the host, so Dynamo would recompile it "
                         f"at nearly every step; use moe_experts=grouped or triton_grouped")
    # every configuration adds entries (batch 1, symbolic batch): a search passes Dynamo's default
    # limit of 8 quickly
    raise_recompile_limit(STEP_COMPILE_RECOMPILE_LIMIT)
    specialize_int_inputs()  # tiles and layer indices stay constants (see its docstring)
    # dynamic=None: the first batch size compiles static, the next one compiles a graph with a
    # symbolic batch that every later size reuses (batch 1 always keeps its own specialisation)
    return torch.compile(decode_and_sample)


def parse_breaks(raw: str | None) -> frozenset[str]:
    ops = frozenset(s.strip() for s in (raw or "").split(",") if s.strip())
    unknown = ops - set(BREAKABLE_OPS)
    if unknown:
        raise ValueError(f"{BREAK_ENV}: unknown op(s) {sorted(unknown)}; expected {BREAKABLE_OPS}")
    return ops


class DecodeSession:
    def __init__(self, config: DecodeConfig, device: str = "cpu", batch: int = 1, *,
                 max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, test_break: str | None = None):
        """test_break: None reads DSV4_TEST_BREAK; "" builds an unbroken session regardless."""
        if batch < 1:
            raise ValueError("batch must be >= 1")
        check_supported(config, device)
        self._forward = step_function(config)  # before any allocation: a bad combination fails fast
        self.device = torch.device(device)
        self.device_name = device_info(device)["name"]
        self.batch, self.max_new_tokens = batch, max_new_tokens
        self.config = config
        # "fp32" must mean fp32: no silent TF32 tensor-core GEMMs (process-wide setting)
        torch.backends.cuda.matmul.allow_tf32 = False
        self.breaks = parse_breaks(os.environ.get(BREAK_ENV) if test_break is None else test_break)
        self.weights = ModelWeights(config, self.device)
        self.cache = DecodeCache(config, batch, config.context_len + max_new_tokens, self.device)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(config.seed + 2)
        self._tokens0 = torch.randint(config.vocab, (batch,), generator=gen, device=self.device)
        self.tokens = self._tokens0.clone()  # [B] int64: this step's input, then its greedy output
        self.last_logits = torch.zeros(batch, config.vocab, device=self.device)  # [B, vocab] fp32
        self._glues: dict[str, Glue] = {}
        self.state = ModelState(config, self.weights, self.cache, make_plans(config),
                                self._glue(config.glue), self.breaks)
        self.weights.sync_hc_cache(self._cached_hc_layers(config))
        self._graph: torch.cuda.CUDAGraph | None = None
        self._ran: dict[tuple[str, int], str] = {}
        self._jitted: set = set()  # (what, variant) pairs already compiled in this process
        self._steps = 0
        self._prepare()

    # ---- the step ----
    def _step_body(self) -> None:
        with torch.no_grad():  # decode; also one grad mode for Dynamo's guards, whatever the caller's
            self._ran = self._forward(self.state, self.tokens, self.last_logits)

    def step(self) -> torch.Tensor:
        """One decode step for the whole batch -> [B] int64 greedy tokens (the next inputs)."""
        if self._steps >= self.max_new_tokens:
            raise RuntimeError(f"KV cache full: {self.max_new_tokens} steps since the prefilled "
                               f"state (capacity {self.cache.capacity_tokens} tokens); call reset()")
        if self._graph is not None:
            self._graph.replay()
        else:
            self._step_body()
        self._steps += 1
        return self.tokens.clone()

    def step_with_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: decode `tokens` [B] as this step's input instead of the last outputs."""
        self.tokens.copy_(tokens.to(device=self.device, dtype=torch.int64))
        return self.step()

    def reset(self) -> None:
        """Caches, position and input tokens back to the prefilled state (in place)."""
        self.cache.restore()
        self.tokens.copy_(self._tokens0)
        self.last_logits.zero_()
        self._steps = 0

    # ---- (re)configuration ----
    def _glue(self, mode: str) -> Glue:
        if mode not in self._glues:
            self._glues[mode] = make_glue(self.config, mode)
        return self._glues[mode]

    @staticmethod
    def _cached_hc_layers(cfg: DecodeConfig) -> set[int]:
        layers = {i for i in range(cfg.n_layers) if cfg.knob("mhc_gemm", i) == "bf16"
                  and cfg.knob("hc_fn_weight", i) == "cached"}
        if cfg.mhc_gemm == "bf16" and cfg.hc_fn_weight == "cached":
            layers.add(-1)  # the hc_head collapse follows the global values
        return layers

    def _jit_keys(self) -> set:
        """The JIT-compiled artefacts the current configuration needs."""
        keys: set = set()
        if self.config.glue != "eager":  # torch.compile, or the Triton glue kernels' JIT
            keys.add(("glue", self.config.glue))
        if self.config.step_compile == "inductor":  # Dynamo guards on every knob and the batch
            keys.add(("step_compile", min(self.batch, 2), repr(self.config.knobs()),
                      repr([p.knobs for p in self.state.plans])))
        if self.device.type == "cuda":
            plans = self.state.plans
            for plan in plans:  # the constexprs each Triton specialisation keys on
                names = ["attention", "attn_block_kv", "attn_num_warps", "attn_num_stages",
                         "attn_split_k"]
                if plan.knobs["attention"] == "mma":  # per_head has no head tiles
                    names.append("attn_heads_per_tile")
                keys.add(tuple(plan.knobs[k] for k in names))
            keys |= model_triton_keys([(p.cls, p.knobs) for p in plans], self.config.knobs())
        return keys

    def _prepare(self) -> str:
        """JIT what is new (one warm-up step, then reset) and capture the graph if asked.
        Returns the restart class of the work done beyond the plain Python switch."""
        done = "none"
        self._graph = None
        new_jit = self._jit_keys() - self._jitted
        if new_jit:
            self._step_body()
            self.reset()
            self._jitted |= new_jit
            done = "recompile"
        if self.config.cuda_graphs == "on":
            self._capture()
            done = "rebuild"
        return done

    def _capture(self) -> None:
        loops = [p.layer for p in self.state.plans if p.knobs["moe_experts"] == "loop"]
        if loops:
            raise RuntimeError(f"cuda_graphs=on cannot capture the step: moe_experts=loop (layers "
                               f"{loops}) reads expert counts on the host (.tolist() sync); use "
                               f"moe_experts=grouped or triton_grouped")
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-up outside capture (allocator, lazy inits)
            for _ in range(2):
                self._step_body()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.reset()
        graph = torch.cuda.CUDAGraph()
        knobs = ", ".join(f"{k}={v}" for k, v in self.config.knobs().items())
        try:
            with torch.cuda.graph(graph):
                self._step_body()
        except Exception as exc:
            raise RuntimeError(f"CUDA graph capture failed for [{knobs}]: {exc}") from exc
        self._graph = graph
        self.reset()

    def reconfigure(self, new_config: DecodeConfig) -> str:
        """Switch to `new_config` (same shape) doing the minimal work; returns the restart class
        actually performed: "none" | "recompile" | "rebuild". ValueError if a shape field differs."""
        diff = [f for f in SHAPE_FIELDS if getattr(new_config, f) != getattr(self.config, f)]
        if diff:
            raise ValueError(f"reconfigure cannot change shape fields {diff}: build a new session")
        check_supported(new_config, str(self.device))
        forward = step_function(new_config)
        old_plans = self.state.plans
        new_plans = make_plans(new_config)
        if ([p.knobs for p in new_plans] == [p.knobs for p in old_plans]
                and new_config.knobs() == self.config.knobs()):
            self.config = self.state.cfg = new_config
            return "none"
        # the step reads global knobs (hc_head's collapse) from state.cfg: it must follow too
        self.config = self.state.cfg = new_config
        self.state.plans = new_plans
        self.state.glue = self._glue(new_config.glue)
        self._forward = forward
        rebuilt = self.weights.sync_hc_cache(self._cached_hc_layers(new_config))
        self.reset()  # every configuration is measured from the prefilled state
        done = self._prepare()  # JIT of new kernels, graph capture
        return "rebuild" if rebuilt else done

    # ---- reporting ----
    def what_ran(self) -> dict[str, str]:
        """What actually ran at the last step, per op and layer class (empty op entries before any
        step), plus the static facts: glue, CUDA graphs, TF32, dtypes, device, test breaks."""
        grouped: dict[str, dict[int, str]] = {}
        for (op, layer), desc in self._ran.items():
            cls = "head" if layer < 0 else self.config.layer_class(layer)
            grouped.setdefault(f"{op}[{cls}]", {})[layer] = desc
        out: dict[str, str] = {}
        for key, by_layer in grouped.items():
            descs = set(by_layer.values())
            out[key] = descs.pop() if len(descs) == 1 else "; ".join(
                f"L{i}: {d}" for i, d in sorted(by_layer.items()))
        out["glue"] = self.state.glue.describe()
        out["step_compile"] = STEP_COMPILE_DESCRIPTIONS[self.config.step_compile]
        if self._graph is not None:
            out["cuda_graphs"] = "on: the whole step replayed from one torch.cuda.CUDAGraph"
        else:
            out["cuda_graphs"] = "off" if self.device.type == "cuda" else "off (n/a on cpu)"
        out["tf32"] = "off (torch.backends.cuda.matmul.allow_tf32=False)"
        out["weights"] = ("bf16 random, seed %d (checkpoint FP8 e4m3 linears / MXFP4 experts not "
                          "reproduced)" % self.config.seed)
        out["kv_cache"] = ("bf16 latent [B, window+compressed, %d] (checkpoint ~584 B FP8 entries not"
                           " reproduced); indexer keys fp8 e4m3 + fp32 scale" % self.config.head_dim)
        out["device"] = f"{self.device} ({self.device_name})"
        if self.breaks:
            out["test_break"] = f"{BREAK_ENV}={','.join(sorted(self.breaks))}: output perturbed"
        return out

    def __repr__(self) -> str:
        return (f"DecodeSession({self.config.preset}, device={self.device}, batch={self.batch}, "
                f"steps={self._steps})")
