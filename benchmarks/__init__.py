"""Benchmarks that print figures: environment overhead now; sandbox, coach, generation and training later."""
