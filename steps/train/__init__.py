"""The training half of a voyage: `pretrain`, `midtrain` and `eval` step types (docs/training.md).

Importing this package, or the step modules a voyage imports (`steps.train.config`,
`steps.train.pretrain`, `steps.train.eval`), imports neither torch nor Ray: both are imported
inside the functions that run, so `marin-run --help` stays fast.
"""
