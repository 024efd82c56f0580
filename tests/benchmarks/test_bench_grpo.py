"""bench_grpo's counting of completion tokens (TRL's log records, Tunix's cut completions) and
its per-side figures over the measured steps."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_grpo as bench  # noqa: E402


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
