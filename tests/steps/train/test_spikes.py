"""The spike guard's records and policy, without a model (steps/train/spikes.py): fast."""

import dataclasses

import pytest

from steps.train.spikes import REWIND, SKIP, SpikeEvent, skipped_ranges, trained_ranges


def test_a_spike_event_is_frozen_and_round_trips_through_its_json_form():
    e = SpikeEvent(16, REWIND, 9.1, 3.2, 7.5, 14.0, to_step=10, skipped=(10, 16))
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.kind = SKIP
    d = e.as_dict()
    assert d == {"step": 16, "kind": "rewind", "loss": 9.1, "grad_norm": 3.2, "z_loss": 7.5, "z_grad": 14.0,
                 "to_step": 10, "skipped": [10, 16]}
    assert SpikeEvent.from_dict(d) == e
    plain = SpikeEvent(3, SKIP, 1.0, 1.0, 6.5, 0.1)
    assert set(plain.as_dict()) == {"step", "kind", "loss", "grad_norm", "z_loss", "z_grad"}


def test_one_reader_of_what_the_events_skipped():
    events = [SpikeEvent(14, SKIP, 1, 1, 7, 7), SpikeEvent(15, SKIP, 1, 1, 7, 7),
              SpikeEvent(16, REWIND, 1, 1, 7, 7, to_step=10, skipped=(10, 16)),
              SpikeEvent(30, SKIP, 1, 1, 7, 7, note="no checkpoint before the spike to rewind to")]
    assert skipped_ranges(events) == [(14, 14, SKIP), (15, 15, SKIP), (10, 16, REWIND), (30, 30, SKIP)]
    assert skipped_ranges([e.as_dict() for e in events]) == skipped_ranges(events)  # as meta.json holds them
    assert trained_ranges(0, 40, events) == [(0, 10), (17, 40)]


def _feed(guard, values, start=0):
    """(step, verdict) for each (loss, grad_norm) in `values`, from step `start`."""
    return [(start + i, guard.observe(start + i, loss, g)) for i, (loss, g) in enumerate(values)]


def _descent(n, start=6.0):
    """A loss falling fast then flattening, with a little noise: the start of a run."""
    return [(start * (0.6 + 0.4 * 0.8 ** i) * (1 + 0.01 * ((i * 7) % 3 - 1)), 1.0 + 0.02 * ((i * 5) % 3)) for i in range(n)]


def test_the_early_descent_neither_hides_a_spike_nor_raises_a_false_one():
    from steps.train.spikes import OK, SpikeConfig, SpikeGuard

    guard = SpikeGuard(SpikeConfig(z=6.0, window=32, min_samples=16, sustained=3))
    clean = _descent(40)
    assert all(v == OK for _, v in _feed(guard, clean)), guard.events  # no false alarm while it falls
    # a loss 30% up (a ratio the plain mean and deviation of the descent would hide), gradient norm normal
    assert guard.observe(40, clean[-1][0] * 1.3, 1.0) == SKIP and guard.events[-1].z_loss > 6


def test_a_poisoned_stretch_is_skipped_one_by_one_against_the_pre_spike_window():
    from steps.train.spikes import OK, SpikeConfig, SpikeGuard

    guard = SpikeGuard(SpikeConfig(z=6.0, window=32, min_samples=16, sustained=3))
    _feed(guard, _descent(40))
    window = list(guard.loss)
    got = _feed(guard, [(9.0, 5.0)] * 5, start=40)  # 5 poisoned steps: more than `sustained`, no lead-in
    assert got == [(n, SKIP) for n in range(40, 45)]  # no rewind: nothing of them reached the weights
    assert list(guard.loss) == window  # outliers never enter the window
    assert guard.observe(45, _descent(41)[-1][0], 1.0) == OK


def test_a_spike_with_a_lead_in_rewinds_drops_only_its_data_and_replays_the_rest():
    from steps.train.spikes import OK, SpikeConfig, SpikeGuard

    cfg = SpikeConfig(z=6.0, window=32, min_samples=16, sustained=3)
    guard = SpikeGuard(cfg)
    clean = _descent(40)
    _feed(guard, clean)
    before = list(guard.loss)
    base = clean[-1][0]
    # two steps creeping up (scored above z/2, under z: trained on), then three outliers
    lead = [(base * 1.10, 1.0), (base * 1.11, 1.0)]
    assert [v for _, v in _feed(guard, lead, start=40)] == [OK, OK]
    assert all(z > cfg.z / 2 for _, z in list(guard.scores)[-2:]), list(guard.scores)[-2:]
    assert [v for _, v in _feed(guard, [(9.0, 5.0)] * 3, start=42)] == [SKIP, SKIP, REWIND]
    assert guard.drop_from() == 40
    guard.rewound(to_step=35, spike_step=44)
    assert guard.events[-1].to_step == 35 and guard.events[-1].skipped == (40, 44)
    # the pre-spike window less the lead-in (the two entries the lead-in pushed out of the full
    # window stay out), never the restored checkpoint's older one
    assert list(guard.loss) == before[2:]
    # steps 35..39 are trained again with their first decisions, leaving the window as it is
    assert [guard.observe(n, 99.0, 99.0) for n in range(35, 40)] == [OK] * 5 and list(guard.loss) == before[2:]
    assert all(guard.dropping(n) for n in range(40, 45)) and not guard.dropping(45)
    assert guard.observe(45, base, 1.0) == OK and guard.drop is None
    # the state a checkpoint keeps makes the same decisions after a resume
    again = SpikeGuard(cfg)
    again.load_state_dict(guard.state_dict())
    assert again.state_dict() == guard.state_dict()


def test_which_saw_never_counts_a_skipped_step_as_held():
    from steps.provenance.which_saw import Training

    t = Training(step="pretrain/x", phase="pretrain", state="CACHED", steps=[14, 16], phase_steps=(0, 21),
                 first_checkpoint=None, skipped=[(14, "rewind"), (16, "skip")])
    assert t.trained == [] and not t.holds  # read at steps 14 and 16, trained on at neither
    t2 = dataclasses.replace(t, steps=[14, 18])
    assert t2.trained == [18] and t2.holds
