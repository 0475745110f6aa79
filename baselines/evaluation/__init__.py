"""Rollouts and evaluation: the envs stepped together, held-out and suite evaluation, teams of policies,
role swaps, and the benchmark protocol."""
