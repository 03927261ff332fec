"""A random-weight model of a real architecture, and a tokenizer trained here, for `transformers serve`.

    python benchmarks/h200_serve_model.py DIR --size llama-1b --device cuda

Sizes (the architectures' published shapes; random weights, nothing downloaded):
  llama-1b    LlamaConfig as Llama-3.2-1B: hidden 2048, 16 layers, 32 heads / 8 KV heads, MLP 8192,
              vocab 128256, tied embeddings (1.24 B parameters, 2.5 GB in bf16)
  qwen2-0.5b  Qwen2Config as Qwen2-0.5B: hidden 896, 24 layers, 14 heads / 2 KV heads, MLP 4864,
              vocab 151936, tied embeddings
  llama-mini  llama-1b's vocabulary and head layout in 2 layers of 256 (the same path, on a CPU)
  tiny        tests/tiny_serving_model.py's (CPU tests of this script)
The tokenizer is tests/tiny_serving_model.py's byte-level BPE trained on generated sentences, its
vocabulary extended to the model's, so every id the random model emits decodes to text.
The model has no end-of-sequence token: every request generates exactly max_tokens. Weights are
initialised on `--device` (seconds on a GPU) and saved in bf16 (float32 for tiny).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

SIZES = {
    "llama-1b": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                               max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                               tie_word_embeddings=True)),
    "qwen2-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                 max_position_embeddings=8192, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                 tie_word_embeddings=True)),
    # Llama-3.2-1B's vocabulary and attention layout in 2 narrow layers: the H200 path on a CPU
    "llama-mini": ("llama", dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=1, head_dim=64, vocab_size=128256,
                                 max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                                 tie_word_embeddings=True)),
}


def build_tokenizer(folder: Path, vocab_size: int) -> int:
    """The trained BPE with its vocabulary extended to `vocab_size` by plain entries no merge reaches
    (`<x12345>`): they decode like any token, and a 128k vocabulary loads in a fraction of a second
    (as added tokens it took 6 s a server start here)."""
    from transformers import AutoTokenizer

    import tiny_serving_model

    tiny_serving_model.build_tokenizer(folder)
    path = folder / "tokenizer.json"
    doc = json.loads(path.read_text())
    vocab = doc["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in doc.get("added_tokens", [])}
    for i in range(vocab_size):
        if i not in taken:
            vocab[f"<x{i}>"] = i
    path.write_text(json.dumps(doc))
    return len(AutoTokenizer.from_pretrained(folder))


def build(folder: Path, size: str, device: str) -> dict:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    import tiny_serving_model

    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if size == "tiny":
        tiny_serving_model.build(folder)
        return {"size": size, "parameters": None, "build_s": time.monotonic() - t0}
    arch, shape = SIZES[size]
    config_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = config_cls(bos_token_id=1, eos_token_id=None, pad_token_id=0, torch_dtype="bfloat16", **shape)
    vocab = build_tokenizer(folder, shape["vocab_size"])
    torch.manual_seed(0)
    with torch.device(device):
        model = model_cls(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=None, pad_token_id=0, do_sample=False)
    model.save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    return {"size": size, "architecture": model_cls.__name__, "parameters": n, "tokenizer_vocab": vocab,
            "config": shape, "dtype": "bfloat16", "build_s": time.monotonic() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--size", default="llama-1b", choices=["tiny", *SIZES])
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    info = build(args.folder, args.size, args.device)
    (args.folder / "autoopt_model.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info))


if __name__ == "__main__":
    main()
