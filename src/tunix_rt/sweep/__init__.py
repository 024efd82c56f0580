"""Hyperparameter sweeps: Optuna studies in the registry database, trials as queue jobs."""
