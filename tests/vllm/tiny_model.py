"""tests/vllm/tiny_model.py: writes a tiny random-weight LlamaForCausalLM for the tests that run
the real vLLM on the CPU (no model can be downloaded here). OUT_DIR gets a transformers
config.json and model.safetensors (1.2 MB), no tokenizer: load it with
`LLM(model=OUT_DIR, skip_tokenizer_init=True, ...)` and prompt with token ids.

    python tests/vllm/tiny_model.py OUT_DIR        # or: tiny_model.write_tiny_llama(OUT_DIR)

The weights come from a seeded generator: the same seed writes the same bytes. The shape suits
vLLM's CPU attention backend (head size 64, block sizes that are multiples of 32) and
prompts of up to 8192 tokens. write_config alone (json only, no torch) is enough for vLLM's
ModelConfig, e.g. to build a Scheduler without weights.
"""

from __future__ import annotations

import json
import os
import sys

# Llama geometry: 2 layers, 2 query heads and 2 KV heads of 64 (hidden 128), vocab 1024.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 1024,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}


def write_config(out_dir: str, **overrides) -> dict:
    """Writes OUT_DIR/config.json (CONFIG updated by overrides) and returns that config."""
    config = {**CONFIG, **overrides}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    return config


def write_tiny_llama(out_dir: str, seed: int = 0, **overrides) -> str:
    """Writes config.json and model.safetensors (random weights from `seed`); returns out_dir."""
    import torch
    from safetensors.torch import save_file

    c = write_config(out_dir, **overrides)
    dtype = getattr(torch, c["torch_dtype"])
    gen = torch.Generator().manual_seed(seed)
    hidden, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    q_dim = c["num_attention_heads"] * c["head_dim"]
    kv_dim = c["num_key_value_heads"] * c["head_dim"]

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(dtype)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=dtype)

    weights = {"model.embed_tokens.weight": rand(vocab, hidden)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights.update({
            p + "input_layernorm.weight": ones(hidden),
            p + "self_attn.q_proj.weight": rand(q_dim, hidden),
            p + "self_attn.k_proj.weight": rand(kv_dim, hidden),
            p + "self_attn.v_proj.weight": rand(kv_dim, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, q_dim),
            p + "post_attention_layernorm.weight": ones(hidden),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
        })
    weights["model.norm.weight"] = ones(hidden)
    weights["lm_head.weight"] = rand(vocab, hidden)
    save_file(weights, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR")
    print(write_tiny_llama(sys.argv[1]))
