"""Tasks: one module (or small folder) each, built on :mod:`mappa_envs.core`."""
