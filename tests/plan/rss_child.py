"""Run a few real training steps in this process and print its peak RSS beside the plan's
prediction, as one JSON line: `python rss_child.py '<TrainConfig fields as JSON>'`.

A child process of its own so that the peak belongs to this run only (VmHWM is a process's
high-water mark). TUNIX_RT_HOME must point at a home (tests use a temporary one, or the
shared test home that holds the imported gemma3-270m).

A run that samples (grpo, rft, dpo with pairs=rollouts, distill with kd_on_policy: the plan
has a rollout phase) also reports each phase's own peak: the high-water mark is reset
(`/proc/self/clear_refs`, 5) when a phase starts and read when it ends; the phases are
setup (model load), rollout (GRPO.rollouts, which rft and dpo's rollout pairs call, or
Distill.sampled), update (the rest of the step), eval (the held-out evaluation: GRPO's
greedy decode, or distill's loss) and after (checkpoint, export).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time

from tunix_rt.files import peak_rss_bytes


class Phases:
    """Peak RSS per phase of a GRPO run (see the module docstring)."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self.starts: dict[str, int] = {}
        self.current = "setup"

    def enter(self, name: str) -> None:
        self.peaks[self.current] = max(self.peaks.get(self.current, 0), peak_rss_bytes())
        self.current = name
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := the current RSS
        self.starts.setdefault(name, peak_rss_bytes())

    def wrap(self, cls, method: str, during: str, after: str) -> None:
        fn = getattr(cls, method)

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            self.enter(during)
            try:
                return fn(*args, **kwargs)
            finally:
                self.enter(after)

        setattr(cls, method, wrapped)


def longest_prompt(fields: dict, home) -> int:
    """Tokens of the longest rendered prompt of the traces file (as GRPO renders them)."""
    from tunix_rt.models.store import load_tokenizer
    from tunix_rt.render import DEFAULT_SYSTEM_PROMPT, prompt_ids

    tok = load_tokenizer(fields["model"], home)
    system = fields.get("system_prompt", DEFAULT_SYSTEM_PROMPT)
    with open(fields["dataset"]) as f:
        return max(len(prompt_ids(json.loads(line)["question"], tok, system)) for line in f if line.strip())


def main() -> None:
    fields = json.loads(sys.argv[1])
    engine = fields.get("engine", "torch")
    if engine == "torch":
        import torch

        torch.set_num_threads(int(fields.pop("_threads", 2)))
    fields.pop("_threads", None)
    from tunix_rt.home import Home
    from tunix_rt.plan import plan_train
    from tunix_rt.train.config import TrainConfig

    fit = fields.pop("_seq_fits_prompts", False)
    room = fields.pop("_seq_is_prompt_plus", None)  # max_seq_len = the longest prompt + this
    home = Home.resolve().ensure()
    if fit:
        fields["max_seq_len"] = longest_prompt(fields, home) + fields["rollout_max_new_tokens"]
    if room is not None:
        fields["max_seq_len"] = longest_prompt(fields, home) + room
    cfg = TrainConfig(**fields)
    plan = plan_train(cfg, "cpu", 1, engine=engine)
    phases = None
    if plan.inputs.rl:
        from tunix_rt.train.distill import Distill
        from tunix_rt.train.grpo import GRPO

        phases = Phases()
        if cfg.method == "distill":
            phases.wrap(Distill, "sampled", "rollout", "update")
            phases.wrap(Distill, "evaluate", "eval", "after")
        else:
            phases.wrap(GRPO, "rollouts", "rollout", "update")
            phases.wrap(GRPO, "evaluate", "eval", "after")
    t0 = time.perf_counter()
    from tunix_rt.train.driver import train

    train(dataclasses.replace(cfg, engine=engine), home)
    out = {"predicted": plan.peak_bytes_per_device, "items": plan.items, "max_seq_len": cfg.max_seq_len,
           "train_s": round(time.perf_counter() - t0, 1)}
    if phases is None:
        out["measured_peak_rss"] = peak_rss_bytes()
    else:
        phases.enter("after")
        m, d = phases.peaks, plan.details
        s = phases.starts
        compare = {  # planned part: (predicted, measured peak, RSS when the phase starts)
            "update": (d["phases"]["update"], m["update"], s["update"]),
            "rollouts": (d["decodes"]["rollouts"]["peak"], m["rollout"], s["rollout"])}
        if "held-out eval" in d["decodes"]:
            compare["held-out eval"] = (d["decodes"]["held-out eval"]["peak"], m["eval"], s["eval"])
        # what a decode adds to what is resident when it starts: its cache and workspace, with
        # the allocator's slack (plan.rl's rule), measured as the phase's peak over its
        # starting RSS (free of the process baseline and of what earlier phases left)
        from tunix_rt.plan import SLACK

        def growth(decode: str, phase: str) -> tuple[int, int]:
            x = d["decodes"][decode]
            return int((x["cache"] + x["workspace"]) * (1 + SLACK["cpu"])), m[phase] - s[phase]

        out.update(measured_peak_rss=max(m.values()), measured_phases=m, phase_start_rss=s,
                   details=d, compare=compare, rollout_growth=growth("rollouts", "rollout"))
        if "held-out eval" in d["decodes"]:
            out["eval_growth"] = growth("held-out eval", "eval")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
