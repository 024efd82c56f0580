"""Shared test data and helpers for the eval tests."""

import torch

from tunix_rt.eval.generate import DecodeConfig, TorchGenerator
from tunix_rt.eval.screened_head import ScreenedArgmax

QUESTIONS = [
    "What is 3+4?",
    "Tom has 12 apples and gives away 5. How many are left?",
    "A train travels 60 km per hour for 3 hours. How far does it go, in kilometres?",
    "Sum 1, 2 and 3.",
    "If a book costs $7 and a pen costs $2, what do 3 books and 4 pens cost together?",
    "Double 21.",
]


def near_tie_head(vocab: int, dim: int, seed: int) -> torch.Tensor:
    """Rows of very different norms (log-normal scales, as real embeddings), a few zero rows,
    and near-copies of some rows: logits that differ by ~1e-4, far below the int8 error."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(vocab, dim, generator=g) * torch.exp(torch.randn(vocab, 1, generator=g))
    w[7] = 0.0
    w[vocab // 2] = 0.0
    for i in range(0, 40, 4):
        w[vocab - 1 - i] = w[i] * (1 + 1e-4)  # a later near-copy, slightly larger
        w[vocab - 2 - i] = w[i + 1] * (1 - 1e-4)  # a later near-copy, slightly smaller
    return w


def aimed_inputs(head: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """Hidden states aimed at the near-copies (so the top two logits nearly tie), plus
    random ones with an outlier dimension (coarse activation quantisation)."""
    g = torch.Generator().manual_seed(seed)
    aimed = head[torch.arange(0, 40, 2)][: n // 2] * 3 + 0.05 * torch.randn(n // 2, head.shape[1], generator=g)
    rand = torch.randn(n - n // 2, head.shape[1], generator=g)
    rand[:, 3] *= 40.0
    return torch.cat([aimed, rand])


def assert_screened(screen: ScreenedArgmax, batch: int = 1) -> None:
    """Where this CPU's int8 kernel is exact the screen did the work; elsewhere it is off and
    every row took full logits."""
    if screen.kernel_exact(batch):
        assert screen.steps > 0
    else:
        assert screen.steps == 0 and screen.full_rows > 0


def stop_early(model, tok, prompts) -> None:
    """Make <end_of_turn> the token the model likes best after its first two, so rows stop
    at different steps (the tied embedding's rows swapped in place)."""
    first = TorchGenerator(model, tok, lean=False).generate(prompts, DecodeConfig(max_new_tokens=12, batch_size=8))
    counts: dict[int, int] = {}
    for g in first:
        for t in g.ids[2:]:
            counts[t] = counts.get(t, 0) + 1
    favourite = max(counts, key=counts.get)
    w = model.get_input_embeddings().weight
    with torch.no_grad():
        w[[favourite, tok.eot_id]] = w[[tok.eot_id, favourite]]
