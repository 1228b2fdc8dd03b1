"""Preference data (DPO, ORPO): every shape is detected and split into prompt / chosen / rejected, the prompt is
never trained, broken pairs stop with file:line, and `kubetune data inspect` shows the pair."""

from __future__ import annotations

import json

import pytest

from kubetune.data.preference import PairEncoder, prepare_preference
from kubetune.data.prepare import choose_template
from kubetune.errors import DataError
from kubetune.spec import load_spec

from .conftest import write_rows
from .test_inspect import run_cli

Q, GOOD_A, BAD_A = "What is the capital of Ghana?", "Accra.", "Lagos."
USER = {"role": "user", "content": Q}
SHAPES = {
    "plain strings": ({"prompt": Q, "chosen": GOOD_A, "rejected": BAD_A}, "preference", False),
    "conversational": (
        {"prompt": [USER], "chosen": [{"role": "assistant", "content": GOOD_A}], "rejected": [{"role": "assistant", "content": BAD_A}]},
        "preference",
        True,
    ),
    "conversational prompt, string answers": ({"prompt": [USER], "chosen": GOOD_A, "rejected": BAD_A}, "preference", True),
    "ultrafeedback binarized": (
        {
            "prompt": Q, "prompt_id": "x1", "score_chosen": 9.0, "score_rejected": 2.0,
            "chosen": [USER, {"role": "assistant", "content": GOOD_A}],
            "rejected": [USER, {"role": "assistant", "content": BAD_A}],
            "messages": [USER, {"role": "assistant", "content": GOOD_A}],
        },  # fmt: skip
        "preference",
        True,
    ),
    "shared-prefix conversations": (
        {"chosen": [USER, {"role": "assistant", "content": GOOD_A}], "rejected": [USER, {"role": "assistant", "content": BAD_A}]},
        "preference_implicit",
        True,
    ),
    "anthropic hh text": (
        {"chosen": f"\n\nHuman: {Q}\n\nAssistant: {GOOD_A}", "rejected": f"\n\nHuman: {Q}\n\nAssistant: {BAD_A}"},
        "preference_implicit",
        True,
    ),
}


def _job(src, **dataset):
    return load_spec({
        "name": "pref-data", "model": {"source": "builtin://tiny-chat"}, "method": {"objective": "dpo"},
        "dataset": {"source": str(src), **dataset}, "training": {"max_seq_length": 256},
    })  # fmt: skip


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_shape_is_detected_and_only_the_answers_are_trained(shape, tmp_path, tokenizer):
    row, fmt, chat = SHAPES[shape]
    src = write_rows(tmp_path / "pairs.jsonl", [row] * 3)
    prepared = prepare_preference(_job(src), tokenizer, source=src)
    assert prepared.stats["format"] == fmt and prepared.stats["rows"] == 3
    assert prepared.stats["chat_template"] == ("chatml" if chat else None)
    first = prepared.train[0]
    prompt, chosen, rejected = (tokenizer.decode(first[c]) for c in ("prompt_ids", "chosen_ids", "rejected_ids"))
    assert Q in prompt and GOOD_A not in prompt and BAD_A not in prompt  # prompt tokens are never scored
    assert chosen.startswith(GOOD_A) and rejected.startswith(BAD_A)  # the answers start right after the prompt
    assert chosen.endswith(tokenizer.eos_token) and rejected.endswith(tokenizer.eos_token)  # the model learns to stop
    if chat:
        assert prompt.endswith("<|im_start|>assistant\n")  # the generation prompt belongs to the prompt
        assert prompt.count("<|im_start|>user") == 1  # ultrafeedback's repeated prompt is not doubled


def test_multi_turn_conversations_share_their_history_as_the_prompt(tmp_path, tokenizer):
    history = [USER, {"role": "assistant", "content": GOOD_A}, {"role": "user", "content": "And of Kenya?"}]
    row = {"chosen": history + [{"role": "assistant", "content": "Nairobi."}], "rejected": history + [{"role": "assistant", "content": "Mombasa."}]}
    src = write_rows(tmp_path / "pairs.jsonl", [row])
    first = prepare_preference(_job(src), tokenizer, source=src).train[0]
    prompt = tokenizer.decode(first["prompt_ids"])
    assert "Accra." in prompt and "And of Kenya?" in prompt  # the earlier answer is context, not trained
    assert tokenizer.decode(first["chosen_ids"]).startswith("Nairobi.") and tokenizer.decode(first["rejected_ids"]).startswith("Mombasa.")


def test_columns_map_other_names(tmp_path, tokenizer):
    src = write_rows(tmp_path / "pairs.jsonl", [{"question": Q, "good": GOOD_A, "bad": BAD_A}] * 2)
    prepared = prepare_preference(_job(src, columns={"prompt": "question", "chosen": "good", "rejected": "bad"}), tokenizer, source=src)
    assert prepared.stats["format"] == "preference" and tokenizer.decode(prepared.train[0]["chosen_ids"]).startswith(GOOD_A)


BROKEN = [
    ({"prompt": Q, "chosen": GOOD_A, "rejected": GOOD_A}, "'chosen' and 'rejected' are the same answer"),
    ({"prompt": Q, "chosen": "  ", "rejected": BAD_A}, "'chosen' is empty"),
    ({"prompt": [USER], "chosen": [{"role": "assistant", "content": GOOD_A}], "rejected": []}, "'rejected' is empty"),
    ({"chosen": [USER, {"role": "assistant", "content": GOOD_A}], "rejected": [USER, {"role": "assistant", "content": GOOD_A}]}, "same answer"),
    ({"chosen": "Accra is right.", "rejected": "Lagos is right."}, "texts without a prompt: add a 'prompt' column"),
    ({"prompt": Q, "chosen": GOOD_A, "rejected": None}, "'rejected' is missing (null)"),
    ({"prompt": Q, "completion": GOOD_A}, "row holds no preference pair (found completion, prompt"),
    ({"prompt": [USER], "chosen": [{"role": "assistant", "content": GOOD_A}], "rejected": BAD_A}, "both be strings or both be message lists"),
]


def test_shapes_are_not_mixed_in_one_dataset(tmp_path, tokenizer):
    src = write_rows(tmp_path / "pairs.jsonl", [SHAPES["plain strings"][0], SHAPES["shared-prefix conversations"][0]])
    with pytest.raises(DataError, match=r"pairs.jsonl:2: a preference_implicit row in a dataset whose rows so far are preference"):
        prepare_preference(_job(src), tokenizer, source=src)


@pytest.mark.parametrize("bad,message", BROKEN)
def test_a_broken_pair_stops_with_file_and_line(bad, message, tmp_path, tokenizer):
    good = SHAPES["plain strings" if "prompt" in bad else "shared-prefix conversations"][0]  # the same shape as the bad row
    src = write_rows(tmp_path / "pairs.jsonl", [good, good, bad])
    with pytest.raises(DataError) as e:
        prepare_preference(_job(src), tokenizer, source=src)
    assert f"{src}:3: " in str(e.value) and message in str(e.value)
    assert "on_bad_rows" in e.value.hint
    skipped = prepare_preference(_job(src, on_bad_rows="skip"), tokenizer, source=src)
    assert skipped.stats["rows"] == 2 and skipped.stats["bad_rows"] == 1 and skipped.stats["bad_examples"][0].startswith(f"{src}:3: ")


def test_long_pairs_are_cut_to_fit_and_prompts_that_fill_the_limit_are_dropped(tmp_path, tokenizer):
    long_answer = {"prompt": Q, "chosen": "yes " * 200, "rejected": "no " * 200}
    long_prompt = {"prompt": "why " * 300, "chosen": GOOD_A, "rejected": BAD_A}
    src = write_rows(tmp_path / "pairs.jsonl", [SHAPES["plain strings"][0], long_answer, long_prompt])
    job = _job(src).with_overrides({"training.max_seq_length": 64})
    prepared = prepare_preference(job, tokenizer, source=src)
    assert prepared.stats["rows"] == 2 and prepared.stats["dropped_too_long"] == 1 and prepared.stats["truncated"] == 1
    for r in prepared.train:
        assert len(r["prompt_ids"]) + max(len(r["chosen_ids"]), len(r["rejected_ids"])) <= 64


def test_eval_split_holds_out_pairs_with_the_seed(tmp_path, tokenizer):
    rows = [{"prompt": f"{Q} {i}", "chosen": GOOD_A, "rejected": BAD_A} for i in range(20)]
    src = write_rows(tmp_path / "pairs.jsonl", rows)
    a = prepare_preference(_job(src, eval_split=0.25), tokenizer, source=src)
    b = prepare_preference(_job(src, eval_split=0.25), tokenizer, source=src)
    assert (a.stats["rows"], a.stats["eval_rows"]) == (15, 5)
    assert a.eval["prompt_ids"] == b.eval["prompt_ids"]  # the same held-out pairs every time
    assert not {tuple(p) for p in a.eval["prompt_ids"]} & {tuple(p) for p in a.train["prompt_ids"]}


def test_pair_encoder_prompt_matches_what_chat_generation_sees(tokenizer):
    """The prompt tokens are the ones the model is given at inference (the template's generation prompt)."""
    from kubetune.data.preference_formats import normalize_preference
    from kubetune.data.formats import inner_keys

    template, _, _ = choose_template(tokenizer, None)
    pair = normalize_preference(SHAPES["conversational"][0], "preference", inner_keys({}))
    prompt_ids, _, _ = PairEncoder(tokenizer, template).encode(pair)
    expected = tokenizer.apply_chat_template([USER], add_generation_prompt=True, tokenize=True)
    expected = expected if isinstance(expected, list) else expected["input_ids"]
    assert prompt_ids == list(expected)


def test_data_inspect_shows_prompt_chosen_and_rejected(tmp_path):
    src = write_rows(tmp_path / "pairs.jsonl", [SHAPES["conversational"][0]] * 4)
    out = run_cli(src, "--json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["objective"] == "dpo" and rep["format"] == "preference" and rep["rows"] == 4
    pair = rep["example"]["pair"]
    assert pair["prompt"][0]["trained"] is False and Q in pair["prompt"][0]["text"]
    assert pair["chosen"][0]["trained"] and pair["chosen"][0]["text"].startswith(GOOD_A)
    assert pair["rejected"][0]["trained"] and pair["rejected"][0]["text"].startswith(BAD_A)
    text = run_cli(src)
    assert text.returncode == 0 and "prompt (not trained)" in text.stdout and "chosen" in text.stdout and "Lagos." in text.stdout


def test_data_inspect_names_the_broken_pair(tmp_path):
    good = SHAPES["plain strings"][0]
    src = write_rows(tmp_path / "pairs.jsonl", [good, {"prompt": Q, "chosen": BAD_A, "rejected": BAD_A}])
    out = run_cli(src)
    assert out.returncode == 2 and f"{src}:2: 'chosen' and 'rejected' are the same answer" in out.stderr
