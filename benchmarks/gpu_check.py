"""One prepared check for a lent GPU machine: the torch engine's CUDA/bf16 path and the JAX
engine's GPU path, run through the real CLI, each stage in its own process with a time limit.

    python3 benchmarks/gpu_check.py [--out DIR] [--budget-s 420] [--only a,b]

Stages (a stage that fails is reported with its error's tail; the others still run):
  models     random-weight HF dirs of gemma3-270m's and gemma3-1b's shapes (tunix_rt.models.tiny)
             with the tiny tokenizer: no weights are downloaded (the machine has no network)
  data       `tunix-rt data import gsm8k` from the vendored GSM8K train split
  sft_lora   `train --config gpu` (Gemma 3 270M shape, LoRA r16, bf16, batch 16 x 512) on cuda
  sft_full   full SFT of the Gemma 3 1B shape, bf16, batch 8 x 512: step time, tokens/s, MFU
             (6 x params x tokens / step time over the card's dense bf16 peak), the memory
             plan's prediction (printed by train) against torch's measured peak
  grpo       `train --config gpu-grpo` on the 270M shape: rollout and update seconds,
             rollout tokens/s
  jax_sft    `train --config gpu --engine jax` (JAX engine on the GPU, LoRA, bf16)
A random model's loss says nothing about learning; only speed, memory and "it runs" are
measured. On the H100 SXM the dense bf16 peak is 989 TFLOP/s (no sparsity).

Last line: RESULT stages_ok=<n>/<m> sft_full_mfu=… lora_tok_s=… grpo_rollout_tok_s=… jax_tok_s=…
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
CLI = [sys.executable, "-c", "from tunix_rt.cli import main; main()"]


def sh(cmd: list[str], timeout: float, log: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run cmd with a time limit, its output appended to log; env: extra variables. At the limit
    it gets SIGTERM (a training run then commits a checkpoint and ends `stopped`), and SIGKILL
    20 s later; rc 124 either way."""
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, **(env or {})})
    try:
        text, rc = p.communicate(timeout=timeout)[0], p.returncode
    except subprocess.TimeoutExpired:
        p.terminate()
        try:
            text = p.communicate(timeout=20)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            text = p.communicate()[0]
        rc, text = 124, f"TIMEOUT after {timeout:.0f}s\n" + (text or "")
    with log.open("a") as f:
        f.write(f"\n$ {' '.join(cmd)}  [{time.time() - t0:.1f}s rc={rc}]\n{text}\n")
    return rc, text


def stage_cli(res: dict, log: Path, save, t_start: float):
    """The CPU benchmarks' stage runner: cli(name, argv, cap) runs `tunix-rt argv` (sh, its
    output in log), records rc, wall seconds and the command under res["stages"][name], saves,
    prints a progress line, and exits with the output's tail when the command failed; else it
    returns the output."""
    def cli(name: str, argv: list[str], cap: float = 7200) -> str:
        t0 = time.time()
        rc, text = sh(CLI + argv, cap, log)
        res["stages"][name] = {"rc": rc, "wall_s": round(time.time() - t0, 1), "cmd": "tunix-rt " + " ".join(argv),
                               **({"tail": text[-1500:]} if rc else {})}
        print(f"[{time.time() - t_start:6.0f}s] {name}: rc={rc} {time.time() - t0:.0f}s", flush=True)
        save()
        if rc:
            raise SystemExit(f"{name} failed (rc {rc}); its output is in {log}:\n{text[-1500:]}")
        return text
    return cli


def run_dir(text: str) -> Path | None:
    m = re.findall(r"(/\S+/runs/[\w.-]+)", text)
    if m:
        return Path(m[-1])
    named = re.findall(r"^run (\S+)$", text, re.M)  # a stage cut by its time limit printed only its id
    return Path(os.environ["TUNIX_RT_HOME"]) / "runs" / named[-1] if named else None


def metrics(run: Path) -> list[dict]:
    f = run / "metrics.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.exists() else []


def predicted_gib(text: str) -> float | None:
    m = re.search(r"predicted peak memory: ([\d.]+) GiB", text)
    return float(m.group(1)) if m else None


def summarise(rows: list[dict], skip: int = 2) -> dict:
    steps = [r for r in rows if "step_s" in r][skip:]
    if not steps:
        return {}
    out = {"steps_timed": len(steps), "step_s_median": statistics.median(r["step_s"] for r in steps),
           "tokens_per_step_mean": statistics.mean(r.get("tokens", 0) for r in steps),
           "peak_mem_gib": max(r.get("peak_mem_bytes", 0) for r in rows) / 2 ** 30}
    out["tok_s"] = out["tokens_per_step_mean"] / out["step_s_median"]
    for k in ("rollout_s", "update_s", "completion_tokens", "gen_tokens", "mean_completion_len"):
        vals = [r[k] for r in steps if isinstance(r.get(k), (int, float))]
        if vals:
            out[f"{k}_median"] = statistics.median(vals)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu-check"))
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--only", default="")
    ap.add_argument("--cpu-dry", action="store_true", help="check the script itself on a CPU: tiny models, "
                    "fp32, 3 steps (no figure means anything)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "gpu_check.log"
    home = Path(os.environ.setdefault("TUNIX_RT_HOME", "/tmp/gpu-check-home"))
    work = Path("/tmp/gpu-check-models")
    deadline = time.time() + args.budget_s
    only = set(filter(None, args.only.split(",")))
    res: dict[str, dict] = {}

    def left(cap: float) -> float:
        return max(5.0, min(cap, deadline - time.time()))

    import torch

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    try:
        import jax

        env["jax"] = jax.__version__
        env["jax_devices"] = [str(d) for d in jax.devices()]
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        env["jax"] = f"unavailable: {type(e).__name__}: {e}"[:300]
    res["env"] = env
    print(json.dumps(env), flush=True)
    peak = next((v for k, v in PEAK_BF16.items() if env["gpu"] and k in env["gpu"]), None)

    def want(name: str) -> bool:
        return not only or name in only

    def stage(name: str, fn) -> None:
        if not want(name):
            return
        t0 = time.time()
        try:
            r = fn()
            r["ok"] = bool(r.get("ok", True))
        except Exception as e:  # noqa: BLE001 - one stage's failure must not hide the rest
            r = {"ok": False, "error": f"{type(e).__name__}: {e}"[-1500:]}
        r["wall_s"] = round(time.time() - t0, 1)
        res[name] = r
        print(name, json.dumps(r)[:1500], flush=True)
        (out / "gpu_check.json").write_text(json.dumps(res, indent=1))

    def models():
        from tunix_rt.models.catalog import get_preset
        from tunix_rt.models.tiny import build_tiny

        names = ("gemma3-270m",) + (("gemma3-1b",) if want("sft_full") or want("sft_full_packed") else ())
        for name in () if args.cpu_dry else names:
            if not (work / name / "config.json").exists():
                build_tiny(get_preset(name), work / name)
        return {"dirs": [str(work / n) for n in ("gemma3-270m", "gemma3-1b")]}

    def data():
        rc, text = sh(CLI + ["data", "import", "gsm8k", str(ROOT / "src/tunix_rt/assets/gsm8k/train.jsonl"),
                             "--name", "gsm8k"], left(120), log)
        return {"ok": rc == 0, "tail": text[-400:]}

    def train(extra: list[str], cap: float, skip: int = 2) -> dict:
        rc, text = sh(CLI + ["train"] + extra, left(cap), log)
        run = run_dir(text)
        r = {"ok": rc == 0, "rc": rc, "predicted_gib": predicted_gib(text)}
        if run:
            r.update(summarise(metrics(run), skip))
        if rc != 0:
            r["tail"] = text[-1500:]
        return r

    common = ["dataset=gsm8k", "epochs=null", "eval_interval=0", "save_interval=0", "eval_limit=16", "log_interval=1",
              "warmup_steps=0"]
    m270, m1b = str(work / "gemma3-270m"), str(work / "gemma3-1b")
    dev_t, dev_j = "device=cuda", "device=gpu"
    if args.cpu_dry:
        m270 = m1b = "tiny-gemma3"
        dev_t = dev_j = "device=cpu"
        common += ["dtype=fp32", "batch_size=2", "max_seq_len=256", "rl_prompts=2"]
    stage("models", models)
    stage("data", data)
    stage("sft_lora", lambda: train(["--config", "gpu", "--engine", "torch", f"model={m270}", "max_steps=3" if args.cpu_dry else "max_steps=12",
                                     dev_t] + common, 150))

    def sft_full(extra: list[str]):
        r = train(["--config", "gpu", "--engine", "torch", f"model={m1b}", "finetune=full", "max_steps=10",
                   "batch_size=8", "lr=1e-5", dev_t] + common + extra, 180)
        from tunix_rt.models.catalog import get_preset

        n = get_preset("gemma3-1b").param_count()
        if r.get("step_s_median") and peak:
            r["params"] = n
            r["tflops"] = 6 * n * r["tokens_per_step_mean"] / r["step_s_median"] / 1e12
            r["mfu"] = r["tflops"] * 1e12 / peak
        if r.get("predicted_gib") and r.get("peak_mem_gib"):
            r["measured_over_predicted"] = r["peak_mem_gib"] / r["predicted_gib"]
        return r

    stage("sft_full", lambda: sft_full([]))
    stage("sft_full_packed", lambda: sft_full(["packing=true", "max_seq_len=2048"]))

    def grpo():
        r = train(["--config", "gpu-grpo", "--engine", "torch", f"model={m270}", "max_steps=4",
                   dev_t, "rollout_max_new_tokens=128"] + common, 200, skip=1)
        comp = r.get("completion_tokens_median")  # the mean completion length of a step
        if comp and r.get("rollout_s_median"):
            rows = (2 if args.cpu_dry else 8) * 4  # rl_prompts x group_size of gpu-grpo (cpu-dry: 2 x 4)
            r["rollout_tok_s"] = comp * rows / r["rollout_s_median"]
        return r

    stage("grpo", grpo)
    stage("jax_sft", lambda: train(["--config", "gpu", "--engine", "jax", f"model={m270}", "max_steps=10",
                                    dev_j] + common, 200))

    ok = [k for k, v in res.items() if k != "env" and v.get("ok")]
    ran = [k for k in res if k != "env"]
    g = lambda s, k: res.get(s, {}).get(k)  # noqa: E731
    fmt = lambda v: "na" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))  # noqa: E731
    print(f"{'stage':10} {'ok':3} {'step_s':>8} {'tok/s':>10} {'peak GiB':>9} {'plan GiB':>9}")
    for k in ran:
        v = res[k]
        print(f"{k:10} {'yes' if v.get('ok') else 'NO':3} {fmt(v.get('step_s_median')):>8} {fmt(v.get('tok_s')):>10} "
              f"{fmt(v.get('peak_mem_gib')):>9} {fmt(v.get('predicted_gib')):>9}")
    print(f"RESULT stages_ok={len(ok)}/{len(ran)} sft_full_mfu={fmt(g('sft_full', 'mfu'))} "
          f"lora_tok_s={fmt(g('sft_lora', 'tok_s'))} grpo_rollout_tok_s={fmt(g('grpo', 'rollout_tok_s'))} "
          f"jax_tok_s={fmt(g('jax_sft', 'tok_s'))}")


if __name__ == "__main__":
    main()
