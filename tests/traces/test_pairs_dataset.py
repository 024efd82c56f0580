"""Preference pairs (prompt/chosen/rejected, traces.pairs) as a dataset of the home: `tunix-rt
data import pairs FILE --name N` validates every line as the pair reader does, stores the pairs
canonically (the same file twice: the same version), splits them by id like traces, and loads
them back as pairs, so `method=dpo pairs=dataset` names the dataset as any run names one."""

from __future__ import annotations

import json

from tunix_rt.traces.dataset import load_dataset
from tunix_rt.traces.pairs import Pair


def _pairs(path, n=20, bad: str | None = None):
    lines = [json.dumps({"prompt": f"Add {i} and 2?", "chosen": f"<answer>{i + 2}</answer>",
                         "rejected": f"<answer>{3 * i + 1}</answer>"}) for i in range(n)]
    if bad is not None:
        lines.insert(3, bad)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_data_import_pairs_stores_a_pairs_dataset(cli, home, tmp_path):
    src = _pairs(tmp_path / "prefs.jsonl")
    r = cli("data", "import", "pairs", src, "--name", "prefs")
    assert r.code == 0, r.err
    ds = load_dataset("prefs", home)
    assert ds.ref == "prefs@v1" and ds.manifest["importer"] == "pairs" and ds.manifest["count"] == 20
    assert all(isinstance(p, Pair) for p in ds.records)
    assert [p.prompt for p in ds.records] == [f"Add {i} and 2?" for i in range(20)]
    assert len(ds.split("train")) + len(ds.split("dev")) == 20
    assert cli("data", "import", "pairs", src, "--name", "prefs").code == 0
    assert [d.name for d in (home.datasets / "prefs").iterdir()] == ["v1"]  # the same content: reused
    assert load_dataset("prefs@v1", home).sha256 == ds.sha256


def test_a_bad_pair_is_named_and_nothing_is_stored(cli, home, tmp_path):
    src = _pairs(tmp_path / "prefs.jsonl", bad=json.dumps({"prompt": "p", "chosen": "x", "rejected": "x"}))
    r = cli("data", "import", "pairs", src, "--name", "prefs")
    assert r.code == 2 and "prefs.jsonl:4: rejected: the same text as chosen" in r.err, r.err
    assert not (home.datasets / "prefs").exists()
    traces = tmp_path / "t.jsonl"
    traces.write_text(json.dumps({"id": "a", "question": "q", "steps": ["s"], "answer": "1"}) + "\n")
    r = cli("data", "import", "pairs", traces, "--name", "prefs")
    assert r.code == 2 and "chosen: missing" in r.err, r.err


def test_a_duplicate_pair_id_is_named_and_nothing_is_stored(cli, home, tmp_path):
    pair = {"prompt": "p", "chosen": "<answer>1</answer>", "rejected": "<answer>2</answer>"}
    src = _pairs(tmp_path / "prefs.jsonl", bad=json.dumps({**pair, "id": "x"}))
    with src.open("a") as f:
        f.write(json.dumps({**pair, "prompt": "q", "id": "x"}) + "\n")  # the same id, line 22
        f.write(json.dumps({"prompt": "Add 0 and 2?", "chosen": "<answer>2</answer>",
                            "rejected": "<answer>1</answer>"}) + "\n")
    r = cli("data", "import", "pairs", src, "--name", "prefs")
    assert r.code == 2 and "prefs.jsonl:22: id: duplicate id 'x' (first on line 4)" in r.err, r.err
    # no id given: a hash of the three texts, so line 1's very pair again is a duplicate too
    assert "prefs.jsonl:23: id: duplicate id" in r.err and "(first on line 1)" in r.err, r.err
    assert not (home.datasets / "prefs").exists()


def test_a_dpo_run_names_a_pairs_dataset_of_the_home(cli, home, tmp_path):
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.driver import train

    assert cli("data", "import", "pairs", _pairs(tmp_path / "prefs.jsonl", n=8), "--name", "prefs").code == 0
    run = train(TrainConfig(model="tiny-gemma3", dataset="prefs", split="all", eval_split="all", eval_limit=2,
                            method="dpo", pref_loss="orpo", batch_size=4, max_seq_len=96, max_steps=1,
                            warmup_steps=0, save_interval=0, device="cpu", engine="torch"), home)
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["dataset"]["name"] == "prefs"
