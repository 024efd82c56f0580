"""The pipeline the CPU benchmarks share (methods_cpu.py, rg_rl_cpu.py): their common options,
the home and output files, the real CLI one stage at a time (gpu_check.stage_cli), model and
GSM8K import, training from one SFT run, greedy evals and exact McNemar between two of them.

    bench = Bench(ap, "methods_cpu", "/tmp/methods-home")   # after the script's own options
    bench.setup(); sft = bench.sft(); bench.eval("greedy_sft", sft, "gsm8k", "dev")

Every figure goes to bench.res, saved to OUT/<name>.json after each stage; every command and its
output to OUT/<name>.log.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from gpu_check import ROOT, metrics, run_dir, stage_cli

#: what --tiny adds to every training run (tiny-gemma3: a check of a script, not a figure)
TINY_OVER = ["lora_rank=8", "max_seq_len=256", "rollout_max_new_tokens=16", "warmup_steps=0"]


class Bench:
    """One CPU benchmark's state: args, res (every figure), the stage runner and its helpers."""

    def __init__(self, ap: argparse.ArgumentParser, name: str, home: str):
        ap.add_argument("--out", default=os.environ.get("OUT", f"/tmp/{name.replace('_', '-')}"))
        ap.add_argument("--sft", default=None, help="an SFT run of the home to start from (default: train one)")
        ap.add_argument("--eval-batch", type=int, default=32)
        ap.add_argument("--tiny", action="store_true", help="tiny-gemma3, a few steps and items: checks the script")
        self.args = args = ap.parse_args()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.home = Path(os.environ.setdefault("TUNIX_RT_HOME", home))
        self.work = self.home / "_evals"
        self.t_start = time.time()
        self.res: dict = {"args": vars(args), "stages": {}, "cpus": os.cpu_count()}
        self.cli = stage_cli(self.res, self.out / f"{name}.log", self.save, self.t_start)
        self.tiny = args.tiny
        self.model = "tiny-gemma3" if self.tiny else "gemma3-270m"
        self.over = [f"model={self.model}", "device=cpu", "dtype=fp32", "save_interval=0", "eval_interval=0",
                     "log_interval=1"] + (TINY_OVER if self.tiny else [])

    def save(self) -> None:
        (self.out / f"{self.name}.json").write_text(json.dumps(self.res, indent=1, default=str))

    def setup(self) -> None:
        """`model import` and `data import gsm8k` of the vendored train split."""
        self.cli("model_import", ["model", "import", self.model])
        self.cli("data_import", ["data", "import", "gsm8k", str(ROOT / "src/tunix_rt/assets/gsm8k/train.jsonl"),
                                 "--name", "gsm8k"])

    def train(self, name: str, argv: list[str]) -> tuple[Path, float]:
        """`train --engine torch argv`: its run directory and wall seconds."""
        t0 = time.time()
        run = run_dir(self.cli(name, ["train", "--engine", "torch"] + argv))
        if run is None:
            raise SystemExit(f"{name}: no run directory in its output")
        return run, time.time() - t0

    def sft(self, extra: list[str] = ()) -> Path:
        """--sft's run of the home, or a new `--config cpu-demo` run on GSM8K (extra: more
        overrides, e.g. the calculator's traces)."""
        if self.args.sft:
            run = self.home / "runs" / self.args.sft
            if not (run / "final").exists():
                raise SystemExit(f"--sft {self.args.sft}: no finished run of that name in {self.home / 'runs'}")
        else:
            run, wall = self.train("sft", ["--config", "cpu-demo"] + self.over + list(extra)
                                   + (["max_steps=3", "batch_size=2"] if self.tiny else []))
            self.res["sft_train_wall_s"] = round(wall, 1)
        self.res["sft_run"] = run.name
        return run

    def step_s(self, run: Path) -> float:
        """A run's mean seconds a step (its logged step_s)."""
        rows = [r for r in metrics(run) if "step_s" in r]
        return sum(r["step_s"] for r in rows) / len(rows)

    def eval(self, name: str, run: Path, dataset: str, split: str, extra: list[str] = ()) -> dict:
        """Greedy `eval --json` of run on dataset's split into work/name: its eval_summary.json."""
        dest = self.work / name
        self.cli(name, ["eval", "--adapter", str(run), "--engine", "torch", "--device", "cpu", "--dataset", dataset,
                        "--split", split, "--batch-size", str(self.args.eval_batch), "--json", "--out", str(dest)]
                 + list(extra))
        return json.loads((dest / "eval_summary.json").read_text())

    def compare(self, a: str, b: str, key: str, **more) -> dict:
        """`compare` of two evals of work/ (exact McNemar): res[key] = p, shared items and the
        discordant counts, and `more`."""
        text = self.cli(key, ["compare", str(self.work / a), str(self.work / b), "--json"])
        c = json.loads(text[text.index("{"):])
        self.res[key] = {"mcnemar_p": c["mcnemar_p"], "shared": c["shared"], "right_to_wrong": len(c["right_to_wrong"]),
                         "wrong_to_right": len(c["wrong_to_right"]), **more}
        self.save()
        return self.res[key]

    def done(self) -> None:
        self.res["wall_s"] = round(time.time() - self.t_start, 1)
        self.save()
