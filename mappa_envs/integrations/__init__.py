"""Optional integrations with other training stacks. Each module imports its own third-party library (an extra:
``pip install mappa-envs[openenv]``); importing :mod:`mappa_envs` never imports any of them.

- :mod:`.openenv_models` and :mod:`.openenv_server`: every registered env served over OpenEnv
  (``mappa env serve ENV_ID``), its wire types and a client.
- :mod:`.verifiers_env`: MathChat as a verifiers v1 environment (the ``verifiers`` extra; the package
  ``deploy/verifiers``, id ``mappa-mathchat``).
"""
