"""The typed records between packages (:mod:`mappa_envs.core.records`): the coach's evaluation, the generation and
the outcome are dataclasses on the action and episode records, written to JSON lines exactly where (and as) the
untyped dicts were, and files written before the types load unchanged."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from mappa_envs.core import (
    ActionRecord,
    CoachEvaluation,
    EpisodeRecord,
    GenerationInfo,
    Outcome,
    read_jsonl,
)
from mappa_envs.core.records import FinishReason, OutcomeKind, ParseKind

FIXTURE = Path(__file__).parent / "fixtures" / "run-e5d7fc4" / "rollouts" / "iter-00000.jsonl"


def test_a_file_written_before_the_types_reads_into_them_and_writes_back_the_same_json():
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()
    episodes = list(read_jsonl(FIXTURE))
    for line, ep in zip(lines, episodes, strict=True):
        assert isinstance(ep.outcome, Outcome) and ep.outcome.kind == "answer"
        for act in ep.actions:
            assert isinstance(act.coach, CoachEvaluation) and isinstance(act.generation, GenerationInfo)
            assert "coach" not in act.info and "generation" not in act.info  # typed, not also left as dicts
        assert json.loads(ep.to_json()) == json.loads(line)["episode"]  # the same keys and values, written back
    assert [e.success for e in episodes] == [False, False, False, True]
    assert episodes[3].outcome.score == 1.0 and episodes[3].outcome["answer"] == episodes[3].outcome.figures["answer"]


def test_fixed_choices_are_literals_and_a_stored_value_outside_them_is_refused():
    assert typing.get_args(ParseKind) == ("strict", "reprompt", "lenient", "rule", "fallback", "ensemble")
    assert set(typing.get_args(FinishReason)) == {"stop", "length", "abort"}
    assert typing.get_args(OutcomeKind) == ("answer", "graded")
    with pytest.raises(ValueError, match="parse 'guess' is not one of"):
        CoachEvaluation.from_dict({"score": 5.0, "parse": "guess"})
    with pytest.raises(ValueError, match=r"unknown keys \['scroe'\]"):
        CoachEvaluation.from_dict({"score": 5.0, "scroe": 4.0})
    with pytest.raises(ValueError, match="finish_reason 'eos' is not one of"):
        GenerationInfo.from_dict({"token_ids": [1], "finish_reason": "eos"})
    with pytest.raises(ValueError, match="2 log-probs for 1 sampled tokens"):
        GenerationInfo([1], "stop", [-0.1, -0.2])
    with pytest.raises(ValueError, match="kind 'partial' is not one of"):
        Outcome.from_dict({"success": True, "kind": "partial"})
    with pytest.raises(ValueError, match="may not hold"):
        Outcome(success=True, score=1.0, figures={"score": 0.5})


def test_a_bad_record_in_a_file_fails_with_its_line_number(tmp_path):
    line = json.loads(FIXTURE.read_text(encoding="utf-8").splitlines()[0])
    line["episode"]["actions"][0]["info"]["coach"]["parse"] = "vibes"
    path = tmp_path / "bad.jsonl"
    path.write_text(FIXTURE.read_text(encoding="utf-8").splitlines()[1] + "\n" + json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: .*parse 'vibes'"):
        list(read_jsonl(path))


def test_the_outcome_reads_records_from_before_the_outcome_contract():
    old_math = Outcome.from_dict({"predicted": "3", "answer": "4", "correct": False})
    assert (old_math.success, old_math.score, old_math.kind, old_math.quality) == (False, 0.0, "answer", None)
    old_graded = Outcome.from_dict({"valid": True, "quality": 0.25})
    assert (old_graded.success, old_graded.score, old_graded.kind, old_graded.quality) == (False, 0.25, "graded", 0.25)
    ep = EpisodeRecord("e", "id", "t", "p", 0, outcome={"success": True})
    assert ep.success and ep.score == 1.0 and ep.kind == "answer"
    assert EpisodeRecord("e", "id", "t", "p", 0).outcome is None  # not ended: no outcome, written as {}
    assert json.loads(EpisodeRecord("e", "id", "t", "p", 0).to_json())["outcome"] == {}


def test_the_outcome_is_also_the_mapping_it_is_written_as():
    o = Outcome(success=True, score=0.5, kind="graded", figures={"quality": 0.5, "metric": "rmse"})
    assert dict(o) == {"quality": 0.5, "metric": "rmse", "success": True, "score": 0.5, "kind": "graded"}
    assert o["metric"] == "rmse" and o.get("missing") is None and "success" in o and len(o) == 5
    assert o == dict(o) and o == Outcome.from_dict(dict(o)) and o != {**dict(o), "score": 0.4}
    assert {**o}["kind"] == "graded"


def test_an_action_takes_its_evaluation_and_generation_typed_whether_given_as_fields_or_in_info():
    ev = CoachEvaluation(score=8.0, reasoning="r", parse="rule")
    a = ActionRecord(
        0,
        "a_0",
        "a",
        1,
        [],
        "out",
        info={"coach": ev.to_dict(), "generation": {"token_ids": [1, 2], "finish_reason": "length"}},
    )
    assert a.coach == ev and a.generation == GenerationInfo([1, 2], "length") and a.generation.truncated
    assert a.info == {}
    with pytest.raises(ValueError, match="'coach' given both as a field and in info"):
        ActionRecord(0, "a_0", "a", 1, [], "out", info={"coach": ev.to_dict()}, coach=ev)
    # another coach's evaluation (mappa rescore) stays under its name in info, read typed by evaluation()
    a.info["rescored"] = CoachEvaluation(score=3.0).to_dict()
    assert a.evaluation("rescored").score == 3.0 and a.evaluation() is a.coach and a.evaluation("missing") is None


def test_an_ensembles_members_are_typed_and_written_as_before():
    members = [CoachEvaluation(score=4.0, parse="rule"), CoachEvaluation(score=6.0, parse="strict", retries=1)]
    ev = CoachEvaluation(score=5.0, parse="ensemble", members=members, normalized_score=4.5)
    d = ev.to_dict()
    assert d["members"] == [m.to_dict() for m in members] and d["members"][1]["reward"] == 0.6
    assert d["normalized_score"] == 4.5 and "normalized_score" not in members[0].to_dict()
    back = CoachEvaluation.from_dict(json.loads(json.dumps(d)))
    assert back == ev and all(isinstance(m, CoachEvaluation) for m in back.members)
