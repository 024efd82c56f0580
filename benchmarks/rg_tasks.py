"""Which reasoning-gym tasks `tunix-rt data import reasoning-gym` takes at their default
difficulty: each task's first items drawn through the importer's own path
(traces.reasoning_gym.make_items: the config as JSON, every record's gold answer scored 1.0 by
the task's verifier), or the reason it refuses the task.

    .venv/bin/python benchmarks/rg_tasks.py [--n 4] [--seed 12345] [--timeout-s 60]

Prints a table (task, importable, seconds, first answer or the refusal) and a last line
RESULT importable=K/N.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tunix_rt.errors import BadInput  # noqa: E402
from tunix_rt.traces import reasoning_gym as rg  # noqa: E402


class Late(Exception):
    pass


def _late(signum, frame):  # noqa: ARG001
    raise Late()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4, help="items drawn per task")
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--timeout-s", type=int, default=60, help="time limit per task")
    args = ap.parse_args()
    signal.signal(signal.SIGALRM, _late)
    rows, ok = [], 0
    for task in rg.task_names():
        t0 = time.perf_counter()
        signal.alarm(args.timeout_s)
        try:
            items = rg.make_items(task, args.n, args.seed, {})
            verdict, detail = "yes", repr(items[0]["answer"][:40])
            ok += 1
        except BadInput as e:
            verdict, detail = "no", str(e)[:160]
        except Late:
            verdict, detail = "no", f"over {args.timeout_s} s"
        finally:
            signal.alarm(0)
        rows.append((task, verdict, time.perf_counter() - t0, detail))
    width = max(len(r[0]) for r in rows)
    print(f"{'task':<{width}}  ok   s      first answer / why not")
    for task, verdict, s, detail in rows:
        print(f"{task:<{width}}  {verdict:<3}  {s:5.1f}  {detail}")
    print(f"RESULT importable={ok}/{len(rows)}")


if __name__ == "__main__":
    main()
