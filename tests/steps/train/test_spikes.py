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
