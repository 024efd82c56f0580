"""lm-evaluation-harness through `tunix-rt eval --harness` (tunix_rt.eval.harness), offline.

The equality test: a tiny Gemma 3 trained for a few steps on toy sums (so it writes tagged
answers, some right and some wrong) is a run's merged export; a local lm-eval task holds the
same items (a jsonl and a task YAML in a tmp dir: generate_until on the question, a regex
filter taking the <answer> tag, exact_match). lm-eval's accuracy must equal `tunix-rt eval`'s
on the same items and prompts, item by item, and both land in the registry where the
leaderboard and compare find them. The scoring test checks our batched log-likelihoods
against a plain forward of each sequence alone; the multiple-choice test runs a local
multiple_choice task with lm-eval's plain prompts."""

from __future__ import annotations

import json
import shutil

import pytest

from requires import require_module

require_module("lm_eval")

import torch  # noqa: E402

from tunix_rt.eval import harness  # noqa: E402
from tunix_rt.eval.generate import DecodeConfig, TorchGenerator  # noqa: E402
from tunix_rt.models.tokenizer import ChatTokenizer  # noqa: E402
from tunix_rt.render import prompt_ids, render_example, target_body  # noqa: E402
from tunix_rt.rundir import PREDICTIONS, SUMMARY  # noqa: E402
from tunix_rt.train.config import TrainConfig  # noqa: E402

from test_eval_toy import SYSTEM, toy_records, train_toy  # noqa: E402

TRAIN_STEPS = 40
"""Enough for tagged answers, not for all of them right (measured: 4 of 9 right)."""

TASK_YAML = """\
task: toy_add
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
  cache_dir: {cache}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["<end_of_turn>"]
  do_sample: false
  max_gen_toks: 40
filter_list:
  - name: tagged
    filter:
      - function: regex
        regex_pattern: "<answer>(.*?)</answer>"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

MC_YAML = """\
task: toy_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
  cache_dir: {cache}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
metadata:
  version: 2
"""


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def trained(tiny_dirs, tmp_path_factory):
    """The toy-trained tiny-gemma3 saved as a merged HF dir (with its tokenizer)."""
    base = tiny_dirs["tiny-gemma3"]
    tok = ChatTokenizer.from_file(base)
    torch.set_num_threads(1)
    model, _ = train_toy(base, tok, toy_records()[::3], TRAIN_STEPS)
    out = tmp_path_factory.mktemp("harness-toy") / "merged"
    model.save_pretrained(out, safe_serialization=True)
    shutil.copyfile(base / "tokenizer.json", out / "tokenizer.json")
    return base, out


def make_run(home, base, merged):
    run = home.runs / "toy-run"
    shutil.copytree(merged, run / "final" / "merged")
    (run / "config.yaml").write_text(TrainConfig(model=str(base), dataset="toy.jsonl", system_prompt=SYSTEM).to_yaml())
    return run


def write_task(tmp_path, template: str, rows: list[dict]):
    d = tmp_path / "tasks"
    d.mkdir()
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "task.yaml").write_text(template.format(data=data, cache=tmp_path / "hf-cache"))
    return d, data


def read_preds(path):
    return {p["id"]: p for p in map(json.loads, (path / PREDICTIONS).read_text().splitlines())}


def test_lm_eval_figure_equals_ours_item_by_item(trained, home, cli, tmp_path):
    base, merged = trained
    run = make_run(home, base, merged)
    items = toy_records()[::3] + [
        {"id": "never-1", "question": "What is 1+1?", "steps": ["1+1=2"], "answer": "no number at all"},
        {"id": "never-2", "question": "What is 4+0?", "steps": ["4+0=4"], "answer": "no number at all"},
    ]
    for r in items:
        r.pop("meta", None)  # lm-eval's json loader and our reader take the same plain rows
    task_dir, data = write_task(tmp_path, TASK_YAML, items)
    common = ["--adapter", str(run), "--max-new-tokens", "40", "--batch-size", "16", "--json"]

    ours = cli("eval", "--dataset", str(data), *common)
    assert ours.code == 0, ours.err
    ours = json.loads(ours.out)
    theirs = cli("eval", "--harness", "toy_add", "--harness-include", str(task_dir), *common)
    assert theirs.code == 0, theirs.err
    [theirs] = json.loads(theirs.out)

    acc = ours["metrics"]["accuracy"]
    assert 0 < acc < 1, ours["metrics"]  # some right, some wrong: equality is not 0 == 0
    n = len(items)  # our summary rounds to 6 places, lm-eval's figure is the plain mean
    assert round(theirs["metrics"]["accuracy"] * n) == round(acc * n) > 0
    assert theirs["metrics"]["accuracy"] == theirs["metrics"]["exact_match,tagged"] == pytest.approx(acc, abs=1e-6)
    assert theirs["metrics"]["format_rate"] == pytest.approx(ours["metrics"]["format_rate"], abs=1e-6)
    assert theirs["harness"]["primary_metric"] == "exact_match,tagged"
    assert theirs["system_prompt"] == ours["system_prompt"] == SYSTEM
    assert theirs["dataset"]["name"] == "lm-eval:toy_add" and theirs["dataset"]["n"] == len(items)

    ours_dir, theirs_dir = run / "eval" / ours["eval_id"], run / "eval" / theirs["eval_id"]
    mine, lm = read_preds(ours_dir), read_preds(theirs_dir)
    assert set(lm) == set(mine) == {r["id"] for r in items}
    for i, p in mine.items():
        assert lm[i]["completion"] == p["completion"], i  # the same prompts, the same decoding
        assert lm[i]["correct"] == p["correct"], i
        assert lm[i]["n_tokens"] == p["n_tokens"] and lm[i]["finish_reason"] == p["finish_reason"]
        if p["answer_source"] == "tag":
            assert lm[i]["answer"] == p["answer"], i
        assert lm[i]["question"] == p["question"] and lm[i]["gold"] == p["gold"]

    from tunix_rt.registry import queries

    evals = {e.dataset: e for e in queries.list_evals(run_id="toy-run")}
    rec = evals["lm-eval:toy_add@1.0"]
    assert rec.accuracy == pytest.approx(acc, abs=1e-6) and rec.n == n and "exact_match,tagged" in rec.metrics
    board = queries.leaderboard(dataset="lm-eval:toy_add@1.0")
    assert [e.id for e in board] == [rec.id]
    assert sum(p.correct for p in queries.predictions(rec.id)[1]) == round(acc * n)

    compared = cli("compare", str(ours_dir), str(theirs_dir), "--json")
    assert compared.code == 0, compared.err
    c = json.loads(compared.out)
    assert c["shared"] == len(items) and c["right_to_wrong"] == [] and c["wrong_to_right"] == []


def test_scores_equal_a_plain_forward_of_each_sequence(tiny_dirs, monkeypatch):
    from lm_eval.api.instance import Instance

    from tunix_rt.eval.runner import load_model

    base = tiny_dirs["tiny-gemma3"]
    tok = ChatTokenizer.from_file(base)
    model = load_model(base, None, "cpu")
    lm = harness.TunixRtLM(TorchGenerator(model, tok), tok, DecodeConfig(batch_size=3), scorer=model)

    # the chat path gives exactly the prompt ids of training and `tunix-rt eval`
    q = "What is 3+4?"
    text = lm.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
    assert lm.context_ids(text) == prompt_ids(q, tok, SYSTEM)
    first = render_example("x", "What is 1+1?", ["1+1=2"], "2", tok, SYSTEM)
    shot = lm.apply_chat_template([{"role": "system", "content": SYSTEM},
                                   {"role": "user", "content": "What is 1+1?"},
                                   {"role": "assistant", "content": target_body(["1+1=2"], "2")},
                                   {"role": "user", "content": q}])
    shot_ids = lm.context_ids(shot)  # a few-shot example is a training example, then the next turn
    assert shot_ids[: len(first.ids)] == first.ids
    assert shot_ids[len(first.ids):] == (tok.encode("\n") + [tok.sot_id] + tok.encode("user\n" + q) + [tok.eot_id]
                                         + tok.encode("\n") + [tok.sot_id] + tok.encode("model\n"))

    def alone(ctx: list[int], cont: list[int]) -> tuple[float, bool]:
        with torch.inference_mode():
            logp = model(input_ids=torch.tensor([ctx + cont])).logits[0].float().log_softmax(-1)
        rows = logp[len(ctx) - 1: len(ctx) - 1 + len(cont)]
        want = torch.tensor(cont)
        return float(rows.gather(-1, want[:, None]).sum()), bool((rows.argmax(-1) == want).all())

    pairs = [(text, " 7"), (text, "<reasoning>\n3+4=7\n</reasoning>\n<answer>7</answer>"),
             ("Question: sky colour?\nAnswer:", " blue"), ("Question: sky colour?\nAnswer: ", "green sea"),
             ("", "hello there"), ("A much longer context, " * 6, " and a continuation of several tokens")]
    monkeypatch.setattr(harness, "LOGIT_BUDGET", 4)  # several slices per batch
    got = lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)])
    for (ctx, cont), (ll, greedy) in zip(pairs, got):
        c_ids, k_ids = lm.pair_ids(ctx, cont)
        ref_ll, ref_greedy = alone(c_ids, k_ids)
        assert ll == pytest.approx(ref_ll, abs=1e-4) and greedy == ref_greedy, (ctx, cont)
    # a model's own greedy continuation is greedy
    g = lm.generator.generate([prompt_ids(q, tok, SYSTEM)], DecodeConfig(max_new_tokens=5))[0]
    assert lm.score([(prompt_ids(q, tok, SYSTEM), g.ids)])[0][1] is True

    # rolling: every token scored once, in disjoint windows of max_length after BOS
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    monkeypatch.setattr(model.config, "max_position_embeddings", 8)
    doc = "one two three four five six seven eight nine ten eleven twelve"
    [rolled] = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (doc,), 0)])
    ids = tok.encode(doc)
    windows = [make_disjoint_window(w) for w in get_rolling_token_windows(ids, tok.bos_id, 8, 1)]
    assert len(windows) > 1 and sum((list(b) for _, b in windows), []) == ids
    assert rolled == pytest.approx(sum(alone(list(a), list(b))[0] for a, b in windows), abs=1e-3)


def test_multiple_choice_task_with_plain_prompts(tiny_dirs, home, cli, tmp_path):
    rows = [{"id": f"c-{i}", "question": q, "choices": ch, "label": lab} for i, (q, ch, lab) in enumerate([
        ("What colour is the sky?", ["blue", "green", "red"], 0),
        ("What is 2+2?", ["3", "4"], 1),
        ("Which is a fruit?", ["apple", "chair", "stone"], 0),
    ])]
    task_dir, _ = write_task(tmp_path, MC_YAML, rows)
    res = cli("eval", "--harness", "toy_choice", "--harness-include", str(task_dir), "--harness-plain",
              "--model", str(tiny_dirs["tiny-gemma3"]), "--limit", "3", "--json")
    assert res.code == 0, res.err
    [s] = json.loads(res.out)
    assert s["harness"]["primary_metric"] == "acc,none" and s["system_prompt"] == ""
    preds = read_preds(home.root / "evals" / s["eval_id"])
    assert set(preds) == {"c-0", "c-1", "c-2"}
    for r in rows:
        p = preds[r["id"]]
        assert p["completion"] in r["choices"] and p["gold"] == r["choices"][r["label"]]
        assert p["correct"] == (p["completion"] == p["gold"]) and p["finish_reason"] == harness.SCORED
    assert s["metrics"]["accuracy"] == pytest.approx(sum(p["correct"] for p in preds.values()) / 3)
    assert json.loads((home.root / "evals" / s["eval_id"] / SUMMARY).read_text())["metrics"]["n"] == 3

    # lm-eval finds our model by name too (simple_evaluate(model="tunix-rt", model_args=…))
    from lm_eval.api.registry import get_model

    lm = get_model("tunix-rt").create_from_arg_string(f"model={tiny_dirs['tiny-gemma3']},device=cpu",
                                                      {"batch_size": 2, "device": None})
    assert isinstance(lm, harness.TunixRtLM) and lm.decode.batch_size == 2 and lm.scorer is not None

    for args, word in ((("--harness", "toy_choice", "--split", "dev"), "--split"),
                       (("--harness", "toy_choice", "--harness-include", str(tmp_path / "none")), "--harness-include"),
                       ((), "--dataset")):
        bad = cli("eval", "--model", "tiny-gemma3", *args)
        assert bad.code == 2 and word in bad.err + bad.out, (args, bad.err)
