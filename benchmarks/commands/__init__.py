"""The commands of ``mappa`` (:mod:`benchmarks.cli`), one module each: its options (``add_parser``) and its work.

``train`` (and its option table), ``ablate``, ``evaluate`` (``mappa eval``), ``run`` (``mappa run``, ``mappa
envs``) and ``report``; ``mappa bench`` and ``mappa sandbox`` keep their own parsers (:mod:`benchmarks.suite`,
:mod:`sandboxes.__main__`).
"""
