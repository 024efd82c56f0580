"""Evaluation: batched generation per engine (generate.py: the Generator interface and the
PyTorch generator; jax_generate.py: the JAX one), scoring (scoring.py), the eval stage that
writes predictions.jsonl and eval_summary.json (runner.py), comparisons (compare.py) and
the `tunix-rt eval` / `tunix-rt compare` commands (cli.py)."""
