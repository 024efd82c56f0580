"""bench_generate's count of the weight bytes a quantised decode step reads (its shares of the
bandwidth bound): each fused int8 matrix once with its fp32 row scales, each int4 matrix at half
a byte a weight plus its fp16 scale and min per row and group of 32."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_step_bytes_count_each_quantised_matrix_once_with_its_scales(home, weights):
    import bench_generate

    from tunix_rt.eval import int8_kernel

    from tunix_rt.errors import BadInput
    from tunix_rt.eval.generate import TorchGenerator
    from tunix_rt.eval.int8_weights import use_weights
    from tunix_rt.eval.runner import load_model
    from tunix_rt.models.store import ensure_model, load_tokenizer

    model_dir = ensure_model("tiny-gemma3", home)
    if weights == "int4" and int8_kernel.decode_library() is None:  # refused where its kernel does not run
        with pytest.raises(BadInput, match="needs the int4 kernel"):
            use_weights(TorchGenerator(load_model(model_dir, None, "cpu"), load_tokenizer(str(model_dir), home), "cpu"),
                        weights)
        return
    c = json.loads((model_dir / "config.json").read_text())
    gen = use_weights(TorchGenerator(load_model(model_dir, None, "cpu"), load_tokenizer(str(model_dir), home), "cpu"),
                      weights)
    d, hd, f = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    qkv = (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * hd
    layer = [(qkv, d), (d, c["num_attention_heads"] * hd), (2 * f, d), (d, f)]
    mats = layer * c["num_hidden_layers"] + [(c["vocab_size"], d)]
    if weights == "int8":
        want = sum(n * k + 4 * n for n, k in mats)
    else:
        want = sum(n * k // 2 + 2 * 2 * n * k // 32 for n, k in mats)
    assert bench_generate.step_bytes(gen.lean)["weights"] == want


def test_decode_clock_times_the_steps_after_the_prefills_picks(home):
    """DecodeClock.decode: the tokens after each row's first (the prefill's pick) over the time
    after that pick, measured inside the call; a call that never ticks counts no decode time."""
    import time

    import bench_generate

    from tunix_rt.eval.generate import DecodeConfig, TorchGenerator
    from tunix_rt.eval.runner import load_model
    from tunix_rt.models.store import ensure_model, load_tokenizer

    model_dir = ensure_model("tiny-gemma3", home)
    tok = load_tokenizer(str(model_dir), home)
    gen = TorchGenerator(load_model(model_dir, None, "cpu"), tok, "cpu")
    prompts = [tok.encode("one two three"), tok.encode("four five")]
    clock = bench_generate.DecodeClock()
    cfg = DecodeConfig(max_new_tokens=6, batch_size=2)

    def run():
        time.sleep(0.05)  # stands for a slow prefill: before the first tick, so outside the decode time
        return bench_generate.ours_generate(gen, prompts, cfg, clock)

    rows, wall, dec_s, dec_n = clock.decode(run)
    assert clock.first_rows == 2 and dec_n == sum(len(r) for r in rows) - 2
    assert 0 < dec_s <= wall - 0.05
    rows, wall, dec_s, dec_n = clock.decode(lambda: [[1, 2, 3]])  # no tick: nothing after a first pick
    assert dec_s == 0 and dec_n == 3 and wall >= 0
