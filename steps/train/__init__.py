"""The training half of a voyage: the `pretrain` and `midtrain` step types (docs/training.md); the
`eval` step type is in `steps.eval`.

Importing this package, or the step modules a voyage imports (`steps.train.config`,
`steps.train.pretrain`, `steps.eval.evaluate`), imports neither torch nor Ray: both are imported
inside the functions that run, so `marin-run --help` stays fast.
"""
