"""A run's files and console: the trajectory store, stored rollouts re-scored, the metrics log, and where the
libraries' output goes."""
