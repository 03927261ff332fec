"""A tiny random Llama and a locally trained tokenizer, saved to a folder `transformers serve` can load.

Nothing is downloaded: the tokenizer is a byte-level BPE trained with the `tokenizers` library on a few
generated sentences, the model is `LlamaConfig` with random weights (2 layers, hidden 64). The model
has no end-of-sequence token, so every generation runs to `max_tokens` and output lengths are fixed
(`transformers serve` takes neither `ignore_eos` nor `min_tokens`).

`process_alive` / `wait_dead` read /proc: the tests' check that no server process is left.

`serving_env(home)` is the environment a test server needs offline: HF_HUB_OFFLINE=1 and an empty hub
cache folder (without one, `/v1/models` fails while scanning the cache).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

VOCAB_SIZE = 512
HIDDEN = 64
LAYERS = 2
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def _corpus(lines: int = 400) -> list[str]:
    words = ("the server decodes tokens at a fixed rate while the batch grows and the cache fills "
             "kernel restart profile bucket gemm cast copy attention expert router latency").split()
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) for i in range(lines)]


def build_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=["<unk>", "<s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)


def build_model(folder: Path, seed: int = 0) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=HIDDEN, intermediate_size=4 * HIDDEN,
                         num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, bos_token_id=1, eos_token_id=None,
                         pad_token_id=0, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=None, pad_token_id=0,
                                               do_sample=False)
    model.save_pretrained(folder)


def build(folder: Path) -> Path:
    """Tokenizer and model under `folder` (created); returns it. A few seconds on a 2-core CPU."""
    folder.mkdir(parents=True, exist_ok=True)
    build_tokenizer(folder)
    build_model(folder)
    return folder


def cached_build(base: Path) -> Path:
    """`build(base / "tiny_model")` once per test session (the test modules share pytest's base temp)."""
    folder = base / "tiny_model"
    if not (folder / "model.safetensors").is_file():
        build(folder)
    return folder


def serving_env(home: Path) -> dict[str, str]:
    """Variables for an offline `transformers serve` whose hub cache is an empty folder under `home`."""
    cache = home / "hub"
    cache.mkdir(parents=True, exist_ok=True)
    return {"HF_HOME": str(home), "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
            "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def process_alive(pid: int) -> bool:
    """True while /proc shows `pid` running (a zombie counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_dead(pid: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process_alive(pid):
        time.sleep(0.1)
    return not process_alive(pid)


if __name__ == "__main__":  # python tests/tiny_serving_model.py DIR
    import sys

    print(build(Path(sys.argv[1])))


TINY_SPACE = """\
name: tiny_transformers_serve
description: the tiny random Llama under `transformers serve`, output tok/s at C=1 and 2
target: server
device: cpu
concurrency: [1, 2]
objective: {{concurrency: 2}}
priors:
  apply_cost_s: {{none: 0, restart: 10}}
server:
  command: {command}
  model: {model}
  port: {port}
  env: {env}
  ready_timeout_s: {ready_timeout_s}
  stop_grace_s: 5
  workload: {{prompt_tokens: 16, output_tokens: {output_tokens}, requests: {requests}, repeats: 2,
             request_timeout_s: 240}}  # a fresh server's first answer took > 60 s on a loaded 2-core machine
  knobs:
    frequency_penalty: {{request: frequency_penalty}}
knobs:
{knobs}
"""

KNOBS = {
    "dtype": "{values: [float32, bfloat16]}",  # --dtype
    "attn_implementation": "{values: [sdpa, eager]}",  # --attn-implementation
    "continuous_batching": "{values: [false, true]}",  # --continuous-batching / --no-continuous-batching
    "frequency_penalty": "{values: [0.0, 0.5], restart_class: none}",  # a request field
}

SERVE_COMMAND = '[transformers, serve, "{model}", --host, "{host}", --port, "{port}", --log-level, info]'


def write_space(path: Path, model: Path, home: Path, command: str = SERVE_COMMAND, port: str = "auto",
                ready_timeout_s: float = 120, output_tokens: int = 8, requests: int = 4,
                knobs: tuple[str, ...] = tuple(KNOBS)) -> Path:
    """A server space for the tiny model (flow-style YAML; the command as an argv list) over `knobs`
    (some of KNOBS; frequency_penalty is always rendered as a request field)."""
    import json

    env = json.dumps(serving_env(home))
    body = "\n".join(f"  {k}: {KNOBS[k]}" for k in knobs)
    path.write_text(TINY_SPACE.format(command=command, model=json.dumps(str(model)), port=port, env=env,
                                      ready_timeout_s=ready_timeout_s, output_tokens=output_tokens,
                                      requests=requests, knobs=body))
    return path
