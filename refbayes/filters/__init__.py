"""Recursive Gaussian filters: one module per family, pure functions plus thin classes.

Every class takes ``(model, likelihood, *, hyper-parameters)``, one name per concept across
classes, ``init(mean, prior_var=1.0)``, randomness as a per-call ``rng=`` argument and
``update_batch`` as the one-step minibatch update: see docs/conventions.md.
"""
