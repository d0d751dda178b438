"""The checkpoint cadence and retention (steps/train/checkpoint_policy.py): one owner, read by the
trainer, retention and --which-saw; torch-free."""

from steps.train.checkpoint_policy import CheckpointConfig, folder, list_checkpoints, step_of


def test_due_and_first_after_agree_step_by_step():
    for policy in (CheckpointConfig(every=5, final_step=23), CheckpointConfig(every=7, final_step=40, permanent_every=4),
                   CheckpointConfig(every=100, final_step=3)):
        saved = [n for n in range(1, policy.final_step + 1) if policy.due(n)]
        assert saved[-1] == policy.final_step  # the phase's last step is always saved
        for s in range(policy.final_step):  # the first save after step s is the least due N > s
            assert policy.first_after(s) == min(n for n in saved if n > s), (policy, s)
    assert [n for n in range(1, 24) if CheckpointConfig(every=5, final_step=23).due(n)] == [5, 10, 15, 20, 23]
    assert [n for n in range(1, 13) if CheckpointConfig(every=6, final_step=12, permanent_every=4).due(n)] == [4, 6, 8, 12]


def test_kept_is_the_newest_the_permanent_and_the_final():
    policy = CheckpointConfig(every=5, final_step=40, keep_last=2, permanent_every=20)
    assert policy.kept([5, 10, 15, 20, 25, 30]) == {20, 25, 30}
    assert policy.kept([20, 35, 40]) == {20, 35, 40}
    assert CheckpointConfig(every=5, final_step=40, keep_last=1).kept([5, 10, 40]) == {40}
    assert CheckpointConfig(every=5, final_step=40, keep_last=3).kept([]) == set()


def test_layout_lists_only_complete_step_folders(tmp_path):
    out = str(tmp_path / "pre")
    for n, complete in ((10, True), (5, True), (15, False)):
        (tmp_path / "pre/checkpoints" / f"step-{n}").mkdir(parents=True)
        if complete:
            (tmp_path / "pre/checkpoints" / f"step-{n}" / "meta.json").write_text("{}")
    (tmp_path / "pre/checkpoints/notes").mkdir()
    assert [(f.step, f.url) for f in list_checkpoints(out)] == [(5, folder(out, 5)), (10, folder(out, 10))]
    assert [f.step for f in list_checkpoints(out, complete=False)] == [5, 10, 15]
    assert step_of(folder(out, 15) + "/") == 15 and step_of(out) is None
    assert list_checkpoints(str(tmp_path / "absent")) == []
