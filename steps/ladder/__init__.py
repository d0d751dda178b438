"""The scaling ladder: small rungs of the recipe, a law fitted to them, a sealed
prediction for a target and its check (docs/ladder.md).

`law` is the fit: L(C) = E + A·C^-α by variable projection with a Huber loss on log residuals,
its residual bootstrap band, the leave-future-out table and the baselines. Pure numpy/scipy.
"""
