"""transformers' model class, imported lean: where tunix-rt takes it from.

No import of tunix_rt here: the loader (models.hf), the tiny-model builder and the GGUF
importer all take their class from it.
"""

from __future__ import annotations


def auto_causal_lm():
    """transformers' AutoModelForCausalLM, its first import made without scikit-learn.
    transformers.generation imports sklearn.metrics whenever sklearn is installed (lm-eval
    installs it) for one option of assisted decoding that tunix-rt never uses, and sklearn
    pulls in scipy, pandas and pyarrow: +73 MiB of RSS in every process that loads a model
    (a Gemma 3 270M DPO worker: 724 -> 651 MiB after loading, peak 2.93 -> 2.85 GiB). Hidden
    for that one import only (transformers then records it as absent); sklearn stays
    importable (lm-eval's metrics import it themselves)."""
    import sys

    if "transformers.generation.candidate_generator" not in sys.modules and "sklearn" not in sys.modules:
        sys.modules["sklearn"] = None  # type: ignore[assignment]  # find_spec -> None: "not installed"
        try:
            import transformers.generation.candidate_generator  # noqa: F401
        finally:
            del sys.modules["sklearn"]
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM
