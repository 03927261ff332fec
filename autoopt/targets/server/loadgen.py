"""autoopt's load generator: streamed OpenAI-compatible requests (completions or chat) at fixed
concurrencies, fixed prompt and output lengths, repeated runs, metrics as `vllm bench serve`.

Lengths: the prompt is made of common English words, a different order per request (no prefix-cache
hits); two calibration requests read the server's `usage.prompt_tokens` for two word counts and fit
tokens = a + b * words, so the prompt lands on the asked token count for this server's tokenizer and
template. The output is `max_tokens`; with fixed_length "auto" the requests also carry
`ignore_eos: true` and `min_tokens` (vLLM, SGLang) unless the server rejects them, which the result
records (`fixed_length.sent`) — the measured output lengths are always reported (`output_lens`).
Output tokens are counted from the stream's `usage` when the server sends it, else one per chunk
(`output_tokens_source` says which).
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from autoopt.targets.server.http_stream import Connection, Endpoint, HTTPError, sse_events
from autoopt.targets.server.metrics import RequestResult, run_metrics, summarize

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case "
         "point number group problem fact house water money month story book night study word family "
         "city river table letter music paper garden window market engine").split()
LENGTH_FIELDS = ("ignore_eos", "min_tokens")


@dataclass(frozen=True)
class Workload:
    model: str
    api: str = "completions"  # completions | chat
    prompt_tokens: int = 128
    output_tokens: int = 128
    requests: int = 16  # per concurrency and repeat (at least the concurrency)
    repeats: int = 3
    fixed_length: str = "auto"  # auto | on | off: send ignore_eos / min_tokens
    extra_body: dict[str, Any] = field(default_factory=dict)  # hot knobs: in every request
    slos: dict[str, float] = field(default_factory=dict)
    request_timeout_s: float = 600.0
    seed: int = 0

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"


@dataclass
class LengthPlan:
    """What the calibration found: words per prompt and whether the length fields are sent."""

    words: int
    send_length_fields: bool
    prompt_tokens_source: str = "usage"  # usage | assumed one token per word
    notes: list[str] = field(default_factory=list)


class LoadGenerator:
    def __init__(self, base_url: str, workload: Workload, headers: dict[str, str] | None = None) -> None:
        self.endpoint = Endpoint.parse(base_url)
        self.workload = workload
        self.headers = dict(headers or {})
        self.lengths = LengthPlan(words=workload.prompt_tokens,
                                  send_length_fields=workload.fixed_length in ("auto", "on"))
        self.output_tokens_source = "usage"

    # ---- one request ---------------------------------------------------------------------------
    def _body(self, index: int, words: int, max_tokens: int) -> dict[str, Any]:
        rng = random.Random(self.workload.seed * 1_000_003 + index)
        text = " ".join(rng.choice(WORDS) for _ in range(max(1, words)))
        body: dict[str, Any] = {"model": self.workload.model, "max_tokens": max_tokens, "stream": True,
                                "stream_options": {"include_usage": True}}
        if self.workload.api == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        if self.lengths.send_length_fields:
            body |= {"ignore_eos": True, "min_tokens": max_tokens}
        return body | dict(self.workload.extra_body)

    async def request(self, conn: Connection, index: int, words: int | None = None,
                      max_tokens: int | None = None) -> RequestResult:
        body = self._body(index, self.lengths.words if words is None else words,
                          self.workload.output_tokens if max_tokens is None else max_tokens)
        start = time.perf_counter()
        result = RequestResult(ok=False, start_s=start)
        seen: dict[str, Any] = {"chunks": 0, "last": start, "usage": None}

        async def consume() -> None:
            async for event in sse_events(conn.stream_post(self.workload.path, body)):
                if not isinstance(event, dict):
                    continue
                seen["usage"] = event.get("usage") or seen["usage"]
                if not _has_text(event):
                    continue
                now = time.perf_counter()
                if seen["chunks"] == 0:
                    result.ttft_s = now - start
                else:
                    result.itl_s.append(now - seen["last"])
                seen["chunks"] += 1
                seen["last"] = now

        try:
            await asyncio.wait_for(consume(), self.workload.request_timeout_s)
        except HTTPError as exc:
            result.error = str(exc)
            return result
        except asyncio.TimeoutError:
            await conn.close()
            result.error = f"no complete answer within {self.workload.request_timeout_s:g} s"
            return result
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            await conn.close()
            result.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return result
        chunks, usage = seen["chunks"], seen["usage"]
        result.latency_s = time.perf_counter() - start
        result.ok = chunks > 0
        result.error = "" if chunks else "the stream ended without a token"
        result.prompt_len = int((usage or {}).get("prompt_tokens") or 0)
        if usage and usage.get("completion_tokens") is not None:
            result.output_len = int(usage["completion_tokens"])
        else:
            result.output_len, self.output_tokens_source = chunks, "one per streamed chunk"
        return result

    # ---- calibration and warm-up ----------------------------------------------------------------
    async def calibrate(self) -> LengthPlan:
        """Two short requests: do the length fields pass, and how many tokens are N words."""
        conn = Connection(self.endpoint, self.headers)
        try:
            probe_words = (max(4, self.workload.prompt_tokens // 2), max(8, self.workload.prompt_tokens))
            first = await self.request(conn, -1, probe_words[0], 2)
            if not first.ok and self.lengths.send_length_fields and self.workload.fixed_length == "auto" \
                    and any(f in first.error for f in LENGTH_FIELDS):
                self.lengths.send_length_fields = False
                self.lengths.notes.append("the server rejected ignore_eos/min_tokens: output length is "
                                          "max_tokens only (see output_lens)")
                first = await self.request(conn, -1, probe_words[0], 2)
            if not first.ok:
                raise ConnectionError(f"the first request failed: {first.error}")
            second = await self.request(conn, -2, probe_words[1], 2)
        finally:
            await conn.close()
        if first.prompt_len and second.prompt_len and second.prompt_len > first.prompt_len:
            per_word = (second.prompt_len - first.prompt_len) / (probe_words[1] - probe_words[0])
            overhead = first.prompt_len - per_word * probe_words[0]
            self.lengths.words = max(1, round((self.workload.prompt_tokens - overhead) / per_word))
        else:
            self.lengths.prompt_tokens_source = "assumed one token per word (no usage in the stream)"
        return self.lengths

    async def run(self, concurrency: int, requests: int | None = None,
                  index_base: int = 0) -> tuple[list[RequestResult], float]:
        """`requests` requests, `concurrency` at a time, each stream on its own connection."""
        n = max(concurrency, requests if requests is not None else self.workload.requests)
        todo = iter(range(index_base, index_base + n))
        results: list[RequestResult] = []

        async def worker() -> None:
            conn = Connection(self.endpoint, self.headers)
            try:
                for index in todo:
                    results.append(await self.request(conn, index))
            finally:
                await conn.close()

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return results, time.perf_counter() - start


def _has_text(event: dict[str, Any]) -> bool:
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content") or delta.get("reasoning_content"):
            return True
    return False


async def sweep_async(gen: LoadGenerator, concurrency: tuple[int, ...], warmup: bool = True,
                      on_run: Callable[[int, int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Calibrate, warm up (one round at the largest C, not counted), then `repeats` runs per C,
    repeats outermost so slow drift spreads over every C. Returns the autoopt result document."""
    started = time.time()
    lengths = await gen.calibrate()
    if warmup:
        await gen.run(max(concurrency), max(concurrency), index_base=10_000_000)
    runs: dict[int, list[dict[str, Any]]] = {c: [] for c in concurrency}
    for rep in range(gen.workload.repeats):
        for c in concurrency:
            results, duration_s = await gen.run(c, index_base=(rep * 1000 + c) * 100_000)
            m = run_metrics(results, duration_s, gen.workload.slos)
            m |= {"max_concurrency": c, "num_prompts": len(results), "repeat": rep}
            runs[c].append(m)
            if on_run is not None:
                on_run(c, rep, m)
    return result_document(gen, lengths, runs, started)


def result_document(gen: LoadGenerator, lengths: LengthPlan, runs: dict[int, list[dict[str, Any]]],
                    started: float) -> dict[str, Any]:
    w = gen.workload
    return {
        "tool": "autoopt bench-serve", "format": 1, "date": time.strftime("%Y%m%d-%H%M%S",
                                                                         time.localtime(started)),
        "base_url": gen.endpoint.url, "endpoint": w.path, "backend": f"openai-{w.api}" if w.api == "chat"
        else "openai", "model_id": w.model, "workload": asdict(w),
        "fixed_length": {"requested": w.fixed_length, "sent": lengths.send_length_fields},
        "prompt_words": lengths.words, "prompt_tokens_source": lengths.prompt_tokens_source,
        "output_tokens_source": gen.output_tokens_source, "notes": list(lengths.notes),
        "results": [{"max_concurrency": c, "summary": summarize(rs), "runs": rs} for c, rs in runs.items()],
    }


def sweep(base_url: str, workload: Workload, concurrency: tuple[int, ...], timeout_s: float | None = None,
          headers: dict[str, str] | None = None, warmup: bool = True,
          on_run: Callable[[int, int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The blocking entry point (`autoopt bench-serve`, the server target). TimeoutError past
    `timeout_s`; ConnectionError when the server cannot be reached or rejects the first request."""
    gen = LoadGenerator(base_url, workload, headers)

    async def bounded() -> dict[str, Any]:
        return await asyncio.wait_for(sweep_async(gen, concurrency, warmup, on_run), timeout_s)

    try:
        return asyncio.run(bounded())
    except asyncio.TimeoutError:
        raise TimeoutError(f"the sweep did not finish within {timeout_s:g} s") from None
