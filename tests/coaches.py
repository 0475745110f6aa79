"""Coaches for tests, loaded by import path (``--coach tests.coaches:LengthCoach``)."""

from mappa_envs.coach.protocol import CoachEvaluation, CoachInput


class LengthCoach:
    """Scores an action by its length in characters, modulo 11. Arbitrary, but a random model's actions then get
    different scores, so every role has advantages to learn from (the rule-based coach scores a random model's
    gibberish alike, and a role whose advantages are all 0 is not updated)."""

    def evaluate(self, inp: CoachInput) -> CoachEvaluation:
        return CoachEvaluation(score=float(len(inp.output) % 11), backend="test-length", parse="rule")
