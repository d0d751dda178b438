"""Ray Train's fixed cost a training step pays: fit() of a one-worker TorchTrainer whose training
function does nothing, with Ray Train's own TorchTrainer and with ours (steps.train.launch:
the placement-group cleaner told to stop within 1 s instead of its 12 s timeout).

    .venv/bin/python -m bench.ray_train_fit [--repeat 2]

Prints each fit's wall time and the ratio ours / Ray's. One embedded local Ray, as marin-run
starts it; Ray Train's own environment settings are those launch.py sets (RAY_TRAIN_ENV)."""

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import os
import time


def _nothing() -> None:
    pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    from steps.train.launch import RAY_TRAIN_ENV, _trainer_class

    os.environ.update({k: v for k, v in RAY_TRAIN_ENV.items() if k not in os.environ})
    import ray
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        times: dict[str, list[float]] = {"ray": [], "ours": []}
        for _ in range(args.repeat):
            for name, cls in (("ray", TorchTrainer), ("ours", _trainer_class())):
                t = time.perf_counter()
                cls(_nothing, scaling_config=ScalingConfig(num_workers=1)).fit()
                times[name].append(time.perf_counter() - t)
        print(f"{'trainer':8} " + " ".join(f"{'fit ' + str(i + 1):>8}" for i in range(args.repeat)) + f" {'best':>8}")
        for name, ts in times.items():
            print(f"{name:8} " + " ".join(f"{t:8.1f}" for t in ts) + f" {min(ts):8.1f}")
        print(f"ours / ray (best): {min(times['ours']) / min(times['ray']):.2f}x")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
