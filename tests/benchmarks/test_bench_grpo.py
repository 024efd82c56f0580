"""bench_grpo's counting of completion tokens (TRL's log records, Tunix's cut completions), its
per-side figures over the measured steps, and the counts behind its shares of the machine's
bounds (the update's model FLOPs, a decode step's weight bytes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_grpo as bench  # noqa: E402
import bench_torch_vs_trl  # noqa: E402

HF = {"hidden_size": 640, "intermediate_size": 2048, "num_attention_heads": 4, "num_key_value_heads": 1,
      "head_dim": 256, "num_hidden_layers": 18, "vocab_size": 262144}  # Gemma 3 270M's shapes


def test_update_flops_are_the_sft_counts_per_token_terms_plus_the_reference_forward():
    sft = bench_torch_vs_trl.sft_step_flops(HF, rows=1, width=300, head_rows=120, lora_rank=16, head_passes=2,
                                            recompute=False, input_grad=True, causal=True, rope_rows=0)
    policy = bench.update_flops(HF, 16, 300, 120, reference=False)
    assert policy == sft["projections"] + sft["head"]  # attention left out: the same terms otherwise
    ref = bench.update_flops(HF, 16, 300, 120, reference=True) - policy
    shapes = bench_torch_vs_trl.projection_shapes(HF).values()
    assert ref == 18 * 300 * sum(2 * k * n for k, n in shapes) + 2 * 120 * 640 * 262144  # base forward + head logits


def test_decode_step_bytes_count_the_fp32_body_its_lora_and_the_head_at_its_width(home):
    import bench_generate
    from tunix_rt.eval.generate import TorchGenerator
    from tunix_rt.eval.runner import load_model
    from tunix_rt.models.store import ensure_model, load_tokenizer

    model_dir = ensure_model("tiny-gemma3", home)
    hf = json.loads((model_dir / "config.json").read_text())
    lean = TorchGenerator(load_model(model_dir, None, "cpu"), load_tokenizer(str(model_dir), home), "cpu").lean
    width = 1 if lean.screen() is not None else 4
    assert bench.decode_step_bytes(hf, 0, width) == bench_generate.step_bytes(lean)["weights"]  # the lean step's own
    lora = bench.decode_step_bytes(hf, 8, width) - bench.decode_step_bytes(hf, 0, width)
    assert lora == hf["num_hidden_layers"] * sum(4 * 8 * (k + n) for k, n in
                                                 bench_torch_vs_trl.projection_shapes(hf).values())
    assert bench.decode_step_bytes(HF, 0, 1) == pytest.approx(0.57e9, rel=0.01)  # the README's 0.57 GB a step, no LoRA


def test_trl_tokens_are_mean_length_times_completions_of_each_step_record():
    logs = [{"loss": 0.1, "completions/mean_length": 100.125, "num_tokens": 1500.0},  # 801 / 8
            {"loss": 0.2, "completions/mean_length": 128.0, "num_tokens": 3100.0},
            {"train_runtime": 30.0, "train_loss": 0.15}]  # the end-of-training summary: no step
    assert bench.trl_step_tokens(logs, 8) == [801, 1024]


def test_tunix_tokens_add_back_the_stop_token_of_completions_that_stopped():
    # 127 sampled + a stop at the 128th token -> 127 returned -> 128; a run to the cap -> 128;
    # a stop sampled first -> 0 returned -> 1
    assert bench.tunix_step_tokens([127, 128, 0, 10], cap=128) == 128 + 128 + 1 + 11


def test_rates_are_totals_over_totals_and_s_per_step_the_median():
    f = bench.summarize([1.0, 2.0, 9.0], [100, 200, 1200], completions=8)
    assert f["s_per_step"] == 2.0
    assert f["tokens_per_step"] == 500.0
    assert f["completions_per_s"] == pytest.approx(24 / 12)
    assert f["tokens_per_s"] == pytest.approx(1500 / 12)
    assert f["s_per_1k_tokens"] == pytest.approx(1000 * 12 / 1500)


def test_summarize_refuses_times_and_tokens_of_different_steps():
    with pytest.raises(ValueError):
        bench.summarize([1.0, 2.0], [100], completions=8)
