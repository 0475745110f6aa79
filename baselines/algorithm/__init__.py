"""The algorithm, free of any system: advantage estimators, the clipped loss, samples from episodes, and what
the update asks of a learner (:mod:`baselines.algorithm.learner`)."""
