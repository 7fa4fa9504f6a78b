"""Smoke tests of the benchmarks: tiny settings, the JSON has its keys and positive numbers (no timing assertions)."""
import json
import math

import pytest

from diffmem.throughput import BenchError, bench_eval, bench_sample, bench_train, matmul_flops_per_s
from diffmem.cli import main

TRAIN_KEYS = ("images_per_s", "s_per_step", "flops_per_step", "achieved_flops_per_s", "peak_flops_per_s",
              "utilisation", "params", "final_loss")


def assert_positive(out, keys):
    for key in keys:
        assert isinstance(out[key], (int, float)) and math.isfinite(out[key]) and out[key] > 0, (key, out[key])


@pytest.mark.e2e
def test_bench_train_reports_throughput_flops_and_utilisation():
    out = bench_train(8, 8, 4, 2, device="cpu", warmup=1, peak_matmul_n=256)
    assert_positive(out, TRAIN_KEYS)
    assert out["batch"] == 4 and out["steps"] == 2 and out["adam_impl"] == "default"
    assert out["images_per_s"] == pytest.approx(out["batch"] / out["s_per_step"])
    assert out["utilisation"] == pytest.approx(out["achieved_flops_per_s"] / out["peak_flops_per_s"])
    json.dumps(out)


@pytest.mark.e2e
def test_flops_per_step_grow_with_batch_and_count_the_backward():
    small = bench_train(8, 8, 2, 1, warmup=0, peak_matmul_n=64)["flops_per_step"]
    large = bench_train(8, 8, 4, 1, warmup=0, adam_impl="fused", channels_last=True,
                        peak_matmul_n=64)["flops_per_step"]
    assert large == pytest.approx(2 * small, rel=0.05)
    forward_only = bench_sample(8, 8, n_samples=2, sampler_steps=2, peak_matmul_n=64)["flops_per_image_step"]
    assert small > 2 * 2 * forward_only  # forward + backward of 2 images is about 3x two forwards


def test_matmul_peak_is_positive():
    assert matmul_flops_per_s("cpu", n=128, repeats=1) > 0


@pytest.mark.e2e
def test_bench_sample_reports_images_per_s():
    out = bench_sample(8, 8, n_samples=4, sampler_steps=2, batch_size=2, peak_matmul_n=64)
    assert_positive(out, ("images_per_s", "seconds", "s_per_model_call", "flops_per_image_step", "utilisation"))
    assert out["n_samples"] == 4 and out["sampler_steps"] == 2


@pytest.mark.e2e
def test_bench_eval_times_every_part():
    out = bench_eval(n_samples=8, sampler_steps=2, n=16, repeats=1, train_steps=2)
    assert_positive(out, ("sample_s", "wall_s", "train_s_per_step", "eval_over_train_last_gap",
                          "eval_over_train_total"))
    for part in ("nn_s", "fid_s", "loss_s"):
        assert out[part] >= 0
    assert out["wall_s"] >= out["sample_s"]


def test_bad_settings_are_a_clear_error():
    with pytest.raises(BenchError, match="batch must be >= 1"):
        bench_train(8, 8, 0, 1)
    with pytest.raises(BenchError, match="adam_impl"):
        bench_train(8, 8, 2, 1, adam_impl="lion")


@pytest.mark.e2e
def test_cli_bench_train_last_line_is_json(capsys):
    assert main(["bench", "train", "--width", "8", "--image-size", "8", "--batch", "2", "--steps", "1",
                 "--warmup", "0", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) > 1  # progress lines first
    out = json.loads(lines[-1])
    assert_positive(out, ("images_per_s", "s_per_step"))


@pytest.mark.e2e
def test_cli_bench_sample_last_line_is_json(capsys):
    assert main(["bench", "sample", "--width", "8", "--image-size", "8", "--n-samples", "2",
                 "--sampler-steps", "2"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["images_per_s"] > 0


def test_the_startup_benchmark_times_command_lines_the_cli_accepts(tmp_path):
    """benchmarks/startup.py times its commands whole, in fresh interpreters: each must stay a command line that
    `diffmem`'s parser accepts, as the verb it is named after."""
    from diffmem.cli import build_parser
    from scripts import load_benchmark

    startup = load_benchmark("startup")
    lines = startup.commands(tmp_path / "exp")
    assert list(lines)[0] == startup.BASELINE and lines[startup.BASELINE][1] == "-c"
    for name, argv in list(lines.items())[1:]:
        assert argv[1:3] == ["-m", "diffmem.cli"]
        assert build_parser().parse_args(argv[3:]).verb == name.split()[1]
