"""Shared by the train tests (tests/train is on sys.path under pytest's rootdir-based import)."""

from __future__ import annotations

import json

import pytest


def write_traces(path, n=16):
    """Short, variable-length traces in the trace format; returns the path as a string."""
    with open(path, "w") as f:
        for i in range(n):
            steps = [f"{i} plus {j} is {i + j}" for j in range(1 + i % 3)]
            f.write(json.dumps({"id": f"t{i:03d}", "question": f"Add {i} and {'one ' * (i % 4)}?",
                                "steps": steps, "answer": str(i)}) + "\n")
    return str(path)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """2 shared cores: one thread avoids OpenMP oversubscription stalls (autouse where imported)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
