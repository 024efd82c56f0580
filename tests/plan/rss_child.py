"""Run a few real training steps in this process and print its peak RSS beside the plan's
prediction, as one JSON line: `python rss_child.py '<TrainConfig fields as JSON>'`.

A child process of its own so that the peak belongs to this run only (ru_maxrss is a
process's high-water mark). TUNIX_RT_HOME must point at a home (tests use a temporary one,
or the shared test home that holds the imported gemma3-270m).
"""

from __future__ import annotations

import json
from tunix_rt.evidence import peak_rss_bytes
import sys
import time


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

    cfg = TrainConfig(**fields)
    home = Home.resolve().ensure()
    plan = plan_train(cfg, "cpu", 1, engine=engine)
    t0 = time.perf_counter()
    if engine == "jax":
        from tunix_rt.train.jax_engine import train
    else:
        from tunix_rt.train.torch_engine import train
    train(cfg, home)
    peak = peak_rss_bytes()
    print(json.dumps({"measured_peak_rss": peak, "predicted": plan.peak_bytes_per_device,
                      "items": plan.items, "train_s": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    main()
