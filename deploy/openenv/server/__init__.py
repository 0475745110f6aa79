"""The OpenEnv server of a mappa env (``server.app:app``)."""
