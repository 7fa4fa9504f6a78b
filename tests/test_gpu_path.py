"""The GPU path, checked on a CPU: training states shaped as a GPU run writes them (a CUDA generator's state is 16
bytes, built here) and torch.cuda's functions replaced by fakes for 1 and 4 visible GPUs. Resume across device kinds
and GPU counts, what a state records of its trajectory, deterministic algorithms, device indices, the bench's peak."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from diffmem.acceleration import CUBLAS_WORKSPACE, deterministic_algorithms, evaluation_copy
from diffmem.cli import main
from diffmem.cluster.base import ClusterError, ClusterOptions
from diffmem.cluster.executors import LocalExecutor, physical_gpus
from diffmem.config import ConfigError, ModelConfig
from diffmem.device import resolve_device
from diffmem.model import build_from_config
from diffmem.rundir import RunDir, Trajectory, TrajectoryNotReplayable, capture_rng, resume_rng
from diffmem.rundir.state import reseed_value
from diffmem.throughput import peak_flops
from diffmem.train import train
from tiny_runs import TINY, sets, tiny_config

H100 = "NVIDIA H100 80GB HBM3"


def cuda_state(k: int) -> torch.Tensor:
    """A CUDA generator's state as torch.cuda.get_rng_state returns it: 16 bytes (Philox seed and offset)."""
    return torch.arange(16, dtype=torch.uint8) + 16 * k


class FakeCuda:
    """torch.cuda's RNG and device functions for ``n`` visible GPUs; records what was set. The per-GPU list
    functions fail the test when called: diffmem must save and restore the GPU in use only."""

    def __init__(self, monkeypatch, n: int):
        self.n, self.set_calls, self.seeded = n, [], []
        self.states = [cuda_state(k) for k in range(n)]
        for name, fake in (("is_available", lambda: True), ("device_count", lambda: self.n),
                           ("current_device", lambda: 0), ("get_device_name", lambda device=None: H100),
                           ("get_rng_state", self.get_rng_state), ("set_rng_state", self.set_rng_state),
                           ("manual_seed_all", self.seeded.append),
                           ("get_rng_state_all", self.per_gpu), ("set_rng_state_all", self.per_gpu)):
            monkeypatch.setattr(torch.cuda, name, fake)

    def index(self, device) -> int:
        device = torch.device(device)
        return 0 if device.index is None else device.index

    def get_rng_state(self, device="cuda"):
        return self.states[self.index(device)].clone()

    def set_rng_state(self, state, device="cuda"):
        assert state.dtype == torch.uint8 and state.numel() == 16
        self.set_calls.append((self.index(device), state.clone()))

    def per_gpu(self, *args):
        raise AssertionError("a state per visible GPU was saved or restored")


def gpu_rng(cuda) -> dict:
    """The "rng" entry of a training state written on a GPU: the batch-order generator on the GPU (16 bytes),
    torch's CPU generator, and ``cuda`` (one state, or the list older diffmem saved)."""
    return {"generator": cuda_state(7), "torch": torch.get_rng_state(), "cuda": cuda}


@pytest.mark.parametrize("visible", [1, 4])
def test_a_gpu_state_holds_the_generator_of_the_gpu_in_use_only(monkeypatch, visible):
    fake = FakeCuda(monkeypatch, visible)
    device = torch.device(f"cuda:{visible - 1}")
    rng = capture_rng(torch.Generator().manual_seed(3), device)
    assert torch.equal(rng["cuda"], cuda_state(visible - 1))  # one 16-byte state, of the device in use
    assert rng["generator"].numel() == 5056  # the stand-in generator here is a CPU one
    assert fake.set_calls == []


@pytest.mark.parametrize("saved_by", ["one state", "a list per visible GPU (older diffmem)"])
def test_a_state_saved_with_four_gpus_visible_resumes_where_one_is(monkeypatch, saved_by):
    fake = FakeCuda(monkeypatch, 1)
    cuda = cuda_state(0) if saved_by == "one state" else [cuda_state(k) for k in range(4)]
    generator = torch.Generator()
    state = {"step": 23, "rng": {**gpu_rng(cuda), "generator": torch.Generator().manual_seed(5).get_state()}}
    assert resume_rng(state, generator, torch.device("cuda")) is None  # same device kind: nothing re-seeded
    assert len(fake.set_calls) == 1 and fake.set_calls[0][0] == 0 and torch.equal(fake.set_calls[0][1], cuda_state(0))
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(5).get_state())


def test_an_older_state_of_four_gpus_restores_the_entry_of_the_gpu_in_use(monkeypatch):
    fake = FakeCuda(monkeypatch, 4)
    state = {"step": 1, "rng": {**gpu_rng([cuda_state(k) for k in range(4)]),
                                "generator": torch.Generator().get_state()}}
    resume_rng(state, torch.Generator(), torch.device("cuda:2"))
    assert fake.set_calls[0][0] == 2 and torch.equal(fake.set_calls[0][1], cuda_state(2))


def test_a_cpu_state_resumed_on_a_gpu_reseeds_its_generators_deterministically(monkeypatch):
    saved_cpu_rng = torch.get_rng_state()
    cpu_state = {"step": 40, "rng": {"generator": torch.Generator().manual_seed(9).get_state(),
                                     "torch": saved_cpu_rng}}
    torch.manual_seed(123)  # moves torch's CPU generator away from the saved state
    fake = FakeCuda(monkeypatch, 1)
    stand_in = torch.Generator()  # stands in for the GPU's generator
    seed = resume_rng(cpu_state, stand_in, torch.device("cuda"))
    assert seed == reseed_value(cpu_state["rng"], 40) and 0 <= seed < 2 ** 63
    assert stand_in.initial_seed() == seed and fake.seeded == [seed] and fake.set_calls == []
    assert torch.equal(torch.get_rng_state(), saved_cpu_rng)
    assert reseed_value(cpu_state["rng"], 41) != seed  # the step is part of the seed


def test_the_trajectory_says_when_training_again_would_not_give_the_same_bits(monkeypatch):
    FakeCuda(monkeypatch, 1)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    det = Trajectory.segment(cuda, deterministic=True, compile=False, channels_last=False)
    assert det == Trajectory("cuda", H100) and not det.not_replayable
    assert Trajectory.segment(cpu, deterministic=False, compile=False, channels_last=False).not_replayable == ""
    fast = Trajectory.segment(cuda, deterministic=False, compile=False, channels_last=False)
    assert fast.not_replayable == "trained on cuda with train.deterministic = false"
    assert det.continued_by(det) == det
    layout = det.continued_by(Trajectory("cuda", H100, channels_last=True))
    assert layout.not_replayable == "resumed with a changed channels_last (False -> True)"
    other_card = det.continued_by(Trajectory("cuda", "NVIDIA A100"))
    assert other_card.not_replayable == "resumed with a changed gpu ('NVIDIA H100 80GB HBM3' -> 'NVIDIA A100')"
    assert fast.continued_by(det).not_replayable == fast.not_replayable  # once lost, never back
    # a state written before the record: a CPU one is replayable as before, a GPU one is not known to be
    current = Trajectory("cpu", compile=True)
    assert Trajectory.saved({"rng": {"generator": torch.Generator().get_state()}}, current) == current
    assert Trajectory.saved({"rng": gpu_rng([cuda_state(0)])}, det).not_replayable
    assert Trajectory.saved({"rng": {}, "trajectory": fast.to_dict()}, det) == fast


def test_deterministic_algorithms_are_set_for_cuda_and_restored(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)
    with deterministic_algorithms(True, torch.device("cpu")):  # CPU kernels are deterministic: nothing changes
        assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
                torch.backends.cudnn.benchmark) == before
    import os
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    with deterministic_algorithms(True, torch.device("cuda")):
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.benchmark and os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    assert torch.are_deterministic_algorithms_enabled() == before[0] and torch.backends.cudnn.benchmark
    with deterministic_algorithms(False, torch.device("cuda")):
        assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic
        assert torch.backends.cudnn.benchmark  # the user's choice stays when determinism is off


def test_a_device_index_beyond_the_visible_gpus_is_one_line(monkeypatch):
    FakeCuda(monkeypatch, 1)
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(ConfigError, match=r"^device 'cuda:1' was asked for but this process sees 1 GPU\(s\), cuda:0 "
                                          r"to cuda:0 \(CUDA_VISIBLE_DEVICES=3\); use --set train.device=cuda") as e:
        resolve_device("cuda:1")
    assert "\n" not in str(e.value)


def test_gpus_are_counted_as_the_parent_process_sees_them(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert physical_gpus((0, 1)) == (0, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert physical_gpus((0, 1)) == (2, 3) and physical_gpus((1,)) == (3,)
    assert LocalExecutor(ClusterOptions("local", gpus=(1,)), "exp").gpus == (3,)
    with pytest.raises(ClusterError, match=r"--gpus 0,2: this process sees GPUs 0 to 1 \(CUDA_VISIBLE_DEVICES=2,3\)"):
        physical_gpus((0, 2))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ClusterError, match="sees no GPU"):
        physical_gpus((0,))


def test_the_bench_peak_is_that_of_the_math_the_step_uses(monkeypatch):
    """On a GPU cuDNN's convolutions use TF32 by default (torch.backends.cudnn.allow_tf32), so the fp32 step's peak
    is measured with TF32 on; under bf16 it is the larger of that and the bf16 peak. The matmul timing is faked to
    record the TF32 flag it ran under (and to say bf16 is 4x faster)."""
    seen = []

    def fake_matmul(device, dtype=torch.float32, n=0, repeats=0):
        seen.append((dtype, torch.backends.cuda.matmul.allow_tf32))
        return 4e12 if dtype == torch.bfloat16 else 1e12

    monkeypatch.setattr("diffmem.throughput.matmul_flops_per_s", fake_matmul)
    # the two TF32 flags are set and put back by hand: on the CUDA build of torch cuBLAS's flag lives behind the
    # module's __getattr__ / __setattr__, and monkeypatch cannot undo a setattr there (AttributeError at teardown)
    flags = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    try:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, False
        peak = peak_flops(torch.device("cuda"), 64)
        assert seen == [(torch.float32, True)] and peak["math"] == "tf32" and peak["peak"] == 1e12
        assert torch.backends.cuda.matmul.allow_tf32 is False  # put back
        torch.backends.cudnn.allow_tf32 = False
        seen.clear()
        peak = peak_flops(torch.device("cuda"), 64, "bf16")
        assert seen == [(torch.float32, False), (torch.bfloat16, False)]
        assert peak["math"] == "bf16" and peak["peak"] == 4e12 and peak["fp32"] == 1e12
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags


def test_the_evaluation_copy_computes_what_a_model_loaded_from_the_checkpoint_computes():
    """A channels-last model rounds differently from the contiguous model `diffmem evaluate` loads; the copy that
    inline evaluation measures gives exactly the loaded model's output, and leaves the trained model as it was."""
    torch.manual_seed(0)
    model = build_from_config(ModelConfig(width=8, attention=False, norm_groups=1), 16).eval()
    x, t = torch.randn(16, 1, 16, 16, generator=torch.Generator().manual_seed(1)), torch.arange(0, 960, 60)
    model.to(memory_format=torch.channels_last)
    loaded = build_from_config(ModelConfig(width=8, attention=False, norm_groups=1), 16).eval()
    loaded.load_state_dict(model.state_dict())
    with torch.no_grad():
        reference = loaded(x, t).sample
        assert not torch.equal(model(x, t).sample, reference)  # the defect: channels-last kernels round otherwise
        rng = torch.get_rng_state()
        copy = evaluation_copy(model)
        assert torch.equal(torch.get_rng_state(), rng)  # no draw
        assert torch.equal(copy(x, t).sample, reference)
    conv = model.conv_in.weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and copy.conv_in.weight.stride() == (9, 9, 3, 1)


def as_gpu_state(path) -> None:
    """Rewrite a CPU run's training state file as a GPU run would have written it: the batch-order generator's state
    16 bytes, a CUDA dropout generator, a trajectory on an H100 (tensors on the CPU: a state is read with
    map_location="cpu")."""
    state = torch.load(path, weights_only=True)
    state["rng"] = gpu_rng(cuda_state(0)) | {"torch": state["rng"]["torch"]}
    state["trajectory"] = Trajectory("cuda", H100).to_dict()
    torch.save(state, path)


@pytest.mark.e2e
def test_a_gpu_state_resumes_on_a_cpu_reseeded_warned_and_recorded(tmp_path):
    """Without the device record PyTorch said "Expected a CPUGeneratorImplState of size 5056 but found the input RNG
    state size to be 16". Now: a warning that says what changes, a `reseeded` entry in config.json, and two resumes of
    one state end with the same weights (the seed derives from the state)."""
    cfg = tiny_config("eval.inline=false", "train.steps=30")
    train(cfg, tmp_path / "a", progress=False, stop_at_step=23)
    as_gpu_state(RunDir(tmp_path / "a").state_path)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for name in ("a", "b"):
        with pytest.warns(UserWarning, match=r"state of step 23 was saved on cuda and this process trains on cpu, "
                                             r"whose generators cannot take its random number states"):
            assert train(cfg, tmp_path / name, progress=False).status == "done"
    a, b = (torch.load(RunDir(tmp_path / n).state_path, weights_only=True) for n in ("a", "b"))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["trajectory"]["device"] == "cpu" and "device ('cuda' -> 'cpu')" in a["trajectory"]["not_replayable"]
    reseeded = json.loads(RunDir(tmp_path / "a").config_path.read_text())["reseeded"]
    assert [(r["step"], r["from_device"], r["to_device"]) for r in reseeded] == [(23, "cuda", "cpu")]


@pytest.mark.e2e
def test_a_state_without_the_device_record_resumes_on_a_cpu_bit_identically(tmp_path):
    cfg = tiny_config("eval.inline=false", "train.steps=30")
    train(cfg, tmp_path / "straight", progress=False)
    train(cfg, tmp_path / "cut", progress=False, stop_at_step=11)
    path = RunDir(tmp_path / "cut").state_path
    state = torch.load(path, weights_only=True)
    del state["trajectory"]  # as diffmem wrote it before the record
    torch.save(state, path)
    assert train(cfg, tmp_path / "cut", progress=False).status == "done"
    a, b = (torch.load(RunDir(tmp_path / n).state_path, weights_only=True) for n in ("straight", "cut"))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert b["trajectory"]["not_replayable"] == ""


@pytest.mark.e2e
def test_a_lost_checkpoint_of_a_trajectory_that_cannot_be_replayed_is_refused_in_one_line(tmp_path, capsys):
    """The run resumed with channels-last on, so training again from step 0 (all contiguous) would round otherwise:
    the rerun refuses before it writes anything."""
    out = tmp_path / "run"
    cfg = tiny_config("eval.inline=false", "train.steps=30")
    train(cfg, out, progress=False, stop_at_step=11)
    assert train(cfg.replace(train={"channels_last": True}), out, progress=False).status == "done"
    run = RunDir(out)
    lost = run.checkpoint_steps()[1]
    run.checkpoint_path(lost).unlink()
    before = sorted(p.name for p in run.path.rglob("*"))
    cfg_path = tmp_path / "tiny.toml"
    cfg_path.write_text("")
    assert main(["train", str(cfg_path), "--no-progress", "--out", str(out),
                 *sets(TINY + ["eval.inline=false", "train.steps=30"])]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"step(s) {lost} are lost" in err
    assert "would write another trajectory's weights (resumed with a changed channels_last (False -> True))" in err
    assert sorted(p.name for p in run.path.rglob("*") if p.name != "lock") == [n for n in before if n != "lock"]
    with pytest.raises(TrajectoryNotReplayable):
        train(cfg, out, progress=False)


@pytest.mark.e2e
def test_inline_evaluation_of_a_channels_last_run_equals_diffmem_evaluate(tmp_path):
    from diffmem.evaluate import evaluate_again

    cfg = tiny_config("train.channels_last=true", "train.steps=10", "eval.times=1")
    train(cfg, tmp_path / "run", progress=False)
    inline = RunDir(tmp_path / "run").metrics()
    again = evaluate_again(tmp_path / "run", inline[-1]["step"], cfg.eval.seed, device="cpu", log=lambda _m: None)
    keys = ("f_mem", "fid", "train_loss", "test_loss", "f_mem_lo", "f_mem_hi")
    assert {k: again[k] for k in keys} == {k: inline[-1][k] for k in keys}
