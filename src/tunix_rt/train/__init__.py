"""Training: one config (config.py), the run directory (run.py), data batches (data.py), the
fused chunked loss (loss.py), atomic checkpoints (checkpoint.py), and two engines:
torch_engine.py (PyTorch, CPU/CUDA) and jax_engine.py (google-tunix, CPU/GPU/TPU)."""
