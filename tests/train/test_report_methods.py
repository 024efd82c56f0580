"""REPORT.md names the method a run trained with and its key figures: a preference run (DPO,
IPO, SimPO, ORPO) its loss, beta, reference and pairs, and the implicit rewards of the chosen
and the rejected completions, their margin and accuracy; a distillation run its teacher,
divergence and temperature, and the KL to the teacher; a rejection-sampling run its
acceptance rule and rounds; a GRPO run its rl_loss. The same figures reach TensorBoard
(train/… and eval/… scalars). Real tiny runs (tiny-gemma3, torch, CPU), evaluated and
packaged by `submit` as a user would."""

from __future__ import annotations

import json

import pytest

from tunix_rt.train.config import TrainConfig
from tunix_rt.train.driver import train
from tunix_rt.train.report import method_line
from train_testlib import one_torch_thread, write_traces  # noqa: F401 (autouse fixture)


def _pairs(path, n=8) -> str:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"Add {i} and 2?", "chosen": f"<reasoning>{i} + 2</reasoning>\n<answer>{i + 2}</answer>",
                                "rejected": f"<answer>{3 * i + 1}</answer>"}) + "\n")
    return str(path)


BASE = dict(model="tiny-gemma3", split="all", eval_split="all", eval_limit=4, batch_size=4, max_seq_len=96, max_steps=3,
            lr=1e-2, warmup_steps=0, save_interval=0, log_interval=1, eval_interval=0, device="cpu", engine="torch",
            system_prompt="Be brief.")


def _tensorboard(run) -> set[str]:
    """The scalar tags of the run's TensorBoard events, as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    return set(acc.Tags()["scalars"])


def _plot_panels(run) -> int:
    """The panels of the run's loss.png: the loss, then one per family of figures (its height,
    read from the PNG header, is 400 px plus 300 px a panel below the loss)."""
    import struct

    width, height = struct.unpack(">II", (run / "loss.png").read_bytes()[16:24])
    assert width == 700 and (height - 400) % 300 == 0, (width, height)
    return 1 + (height - 400) // 300


def _report(run, tmp_path, home) -> str:
    """`tunix-rt eval --adapter RUN` on two traces, then `tunix-rt submit RUN`: REPORT.md."""
    from tunix_rt.eval.generate import DecodeConfig
    from tunix_rt.eval.runner import EvalRequest, run_eval
    from tunix_rt.submit import build

    run_eval(EvalRequest(dataset=write_traces(tmp_path / "eval.jsonl", 2), adapter=str(run), engine="torch",
                         device="cpu", decode=DecodeConfig(max_new_tokens=4)), home)
    build(run, tmp_path / "package.zip", home=home)
    return (run / "REPORT.md").read_text()


def test_a_simpo_run_reports_its_loss_and_implicit_rewards(home, tmp_path):
    cfg = TrainConfig(**BASE, dataset=_pairs(tmp_path / "pairs.jsonl"), method="dpo", pref_loss="simpo",
                      pref_beta=2.0, simpo_gamma=1.0)
    run = train(cfg, home)
    assert {"train/rewards_chosen", "train/rewards_rejected", "train/rewards_margin", "train/rewards_accuracy",
            "eval/eval_rewards_margin", "eval/eval_rewards_accuracy", "eval/eval_loss"} <= _tensorboard(run)
    assert _plot_panels(run) == 3  # the loss, the implicit rewards, their accuracy
    text = _report(run, tmp_path, home)
    assert "dpo with lora" in text
    assert "- preference optimisation: SimPO, beta 2.0, gamma 1.0, label smoothing 0.0; no reference model; pairs from" in text
    assert "Implicit rewards over 3 steps with pairs (6 pairs), first five steps → last five steps; held out at step 3:" in text
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    for label in ("chosen reward", "rejected reward", "margin (chosen − rejected)", "accuracy (chosen reward higher)"):
        assert label in rows and rows[label].count("|") == 5, label  # train first, train last, held out
    assert rows["accuracy (chosen reward higher)"].rstrip(" |").endswith("%")
    assert "Preference loss per pair:" in text and "Loss per supervised token" not in text


def test_a_dpo_run_names_its_reference(home, tmp_path):
    cfg = TrainConfig(**BASE, dataset=_pairs(tmp_path / "pairs.jsonl"), method="dpo", pref_loss="dpo", pref_beta=0.1)
    text = _report(train(cfg, home), tmp_path, home)
    assert "- preference optimisation: DPO (sigmoid), beta 0.1, label smoothing 0.0; reference: the adapter-off model;" in text
    assert "| margin (chosen − rejected) |" in text


def test_a_distill_run_reports_its_teacher_and_kl(home, tmp_path):
    """The teacher is a run of this home (a trained SFT run: its adapter merged into its base)."""
    sft = train(TrainConfig(**{**BASE, "max_steps": 2}, dataset=write_traces(tmp_path / "traces.jsonl", 8), method="sft"), home)
    cfg = TrainConfig(**{**BASE, "batch_size": 2}, dataset=write_traces(tmp_path / "traces.jsonl", 8), method="distill",
                      teacher=sft.name, kd_loss="jsd", kd_beta=0.5, kd_temperature=2.0, kd_alpha=0.1)
    run = train(cfg, home)
    assert {"train/kl_teacher", "train/kd", "train/nll", "eval/eval_kl_teacher"} <= _tensorboard(run)
    assert _plot_panels(run) == 2 and _plot_panels(sft) == 1  # the loss and the KL to the teacher; SFT: the loss
    text = _report(run, tmp_path, home)
    assert (f"- distillation: teacher `{sft.name}`, jsd (beta 0.5), temperature 2.0, NLL weight alpha 0.1, "
            "off-policy (the dataset's traces)") in text
    assert "| KL(teacher ‖ student) |" in text and "| student NLL of the targets |" in text
    assert "Held-out KL to the teacher at step 3:" in text


def test_an_rft_run_reports_its_acceptance_rule_and_rounds(home, tmp_path):
    cfg = TrainConfig(**{**BASE, "max_steps": 2}, dataset=write_traces(tmp_path / "traces.jsonl", 8), method="rft",
                      group_size=2, rl_prompts=2, rollout_max_new_tokens=8, rft_round_steps=1,
                      rft_accept={"format": 0.0})  # every sample accepted: each round trains
    run = train(cfg, home)
    assert {"train/kept_share", "train/rft_kept", "train/rft_samples", "train/reward"} <= _tensorboard(run)
    assert _plot_panels(run) == 3  # the loss, the rewards, the kept share
    text = _report(run, tmp_path, home)
    assert ('- rejection sampling (RFT): 2 prompts x 2 samples a round, kept when {"format": 0.0} (each reward at '
            "least its threshold; one of each distinct completion), 1 SFT step a round, rewards") in text
    assert "| round | step | samples | accepted | kept | kept share |" in text and "Over 2 rounds:" in text


@pytest.mark.parametrize("preset,expect", [
    ("cpu-simpo", "- preference optimisation: SimPO, beta 2.0, gamma 1.0, label smoothing 0.0; no reference model; "
                  "on-policy pairs: 4 prompts x 4 samples a step ranked by rewards"),
    ("gpu-dpo", "- preference optimisation: DPO (sigmoid), beta 0.1, label smoothing 0.0; reference: the adapter-off "
                "model; on-policy pairs: 8 prompts x 4 samples a step"),
    ("cpu-rft", '- rejection sampling (RFT): 8 prompts x 8 samples a round, kept when {"answer": 1.0, "format": 1.0}'),
    ("cpu-distill", "- distillation: teacher `gemma3-1b`, jsd (beta 0.5), temperature 1.0, NLL weight alpha 0.0, "
                    "off-policy"),
    ("cpu-grpo", "- RL: "),
])
def test_each_method_preset_has_its_line(preset, expect):
    line = method_line(TrainConfig.load(preset).to_dict())
    assert line.startswith(expect), line


def test_orpo_ipo_and_an_sft_run():
    orpo = TrainConfig.load("cpu-simpo", ["pref_loss=orpo", "orpo_lambda=0.2", "init=sft-run"]).to_dict()
    assert method_line(orpo).startswith("- preference optimisation: ORPO, lambda 0.2; no reference model;")
    assert method_line(orpo).endswith(", from run `sft-run`")
    ipo = TrainConfig.load("cpu-simpo", ["pref_loss=ipo", "pref_beta=0.5"]).to_dict()
    assert method_line(ipo).startswith("- preference optimisation: IPO, tau 0.5; reference: the adapter-off model;")
    full = TrainConfig.load("cpu-simpo", ["pref_loss=dpo", "finetune=full"]).to_dict()
    assert "; reference: a frozen copy of the starting weights;" in method_line(full)
    assert method_line(TrainConfig.load("smoke").to_dict()) is None
