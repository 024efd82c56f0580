"""Preference pairs: `{"prompt", "chosen", "rejected"}` JSONL, as TRL's DPOTrainer reads its
standard (not conversational) format, for method=dpo (train.preference).

    {"prompt": "What is 2 + 3?", "chosen": "<reasoning>2 + 3 = 5</reasoning>\\n<answer>5</answer>",
     "rejected": "<answer>6</answer>", "id": "optional"}

`prompt` is the user's question (rendered with the run's system prompt into the same Gemma
turn as SFT and eval render it); `chosen` and `rejected` are model turns, any text (our
<reasoning>/<answer> format is not required: a pair may prefer a format, or anything else).
Every field is a non-blank string; `chosen` and `rejected` differ; no other field. A pair's
id is its `id`, else a hash of its three texts, so the train/dev split (by id, as for traces)
never moves a pair when the file grows.

The file is read by the strict trace reader (traces.reader.scan with `PairImporter`): every
bad line is named `FILE:LINE: FIELD: reason` and nothing is read when any line is bad. A
trace JSONL path and a pairs JSONL path are both a `dataset=` reference
(traces.dataset.load_dataset tells them apart by the first line's keys); `tunix-rt data import
pairs FILE --name N` (or an API upload, format pairs or auto) stores the pairs as a dataset of
the home (manifest importer "pairs"), which a job, the web UI's run form and a sweep name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunix_rt.traces.schema import RecordError, json_type

FIELDS = ("prompt", "chosen", "rejected")
OPTIONAL = ("id",)


@dataclass(frozen=True)
class Pair:
    id: str
    prompt: str
    chosen: str
    rejected: str

    def to_record(self) -> dict[str, Any]:
        """The canonical JSON object of the pair (its bytes give the dataset's sha256)."""
        return {"id": self.id, "prompt": self.prompt, "chosen": self.chosen, "rejected": self.rejected}


def pair_id(prompt: str, chosen: str, rejected: str) -> str:
    blob = json.dumps([prompt, chosen, rejected], ensure_ascii=False, separators=(",", ":"))
    return f"pair-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class PairImporter:
    """traces.importers.Importer for pair rows (one JSON object -> Pair, or RecordError)."""

    name: str = "pairs"

    def convert(self, obj: dict[str, Any], index: int) -> Pair:
        problems = [(k, "missing") for k in FIELDS if k not in obj]
        problems += [(k, f"unknown field (a pair has {', '.join(FIELDS)} and optionally id)")
                     for k in obj if k not in FIELDS + OPTIONAL]
        for key in FIELDS + OPTIONAL:
            if key not in obj:
                continue
            value = obj[key]
            if isinstance(value, list) and key in FIELDS:
                problems.append((key, "expected a string, got a list (TRL's conversational format is not read: "
                                      "give the prompt and the model turns as plain text)"))
            elif not isinstance(value, str):
                problems.append((key, f"expected a string, got {json_type(value)}"))
            elif not value.strip():
                problems.append((key, "empty string"))
        if not problems and obj["chosen"] == obj["rejected"]:
            problems.append(("rejected", "the same text as chosen (a pair must prefer one of two)"))
        if problems:
            raise RecordError(problems)
        return Pair(obj.get("id") or pair_id(obj["prompt"], obj["chosen"], obj["rejected"]),
                    obj["prompt"], obj["chosen"], obj["rejected"])


def looks_like_pairs(path: Path) -> bool:
    """Whether the file's first line is a JSON object with `chosen` and `rejected` (then the
    whole file is read as pairs, strictly); False for anything else, the trace reader decides."""
    try:
        with Path(path).open("rb") as f:
            first = json.loads(f.readline(1 << 20).decode("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and "chosen" in first and "rejected" in first
