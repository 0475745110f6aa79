"""The top floor: the `mappa` command line (`benchmarks.cli`), training reports (`benchmarks.report`) and the
performance suite (`mappa bench`: environment, sandbox, coach, generation and training figures beside references)."""
