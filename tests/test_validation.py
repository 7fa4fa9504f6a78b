"""One validation of every config key: each field of every config dataclass has at least one invalid value, and each
gives one line on stderr naming the key, exit 2 and nothing written (through the real CLI: `train` for the run
sections, `sweep` for [sweep], `theory sweep` for [theory]). NaN and infinity are refused in every float field."""
from __future__ import annotations

import dataclasses
import typing
import warnings

import pytest

from diffmem import config
from diffmem.cli import main
from tiny_runs import SMOKE, sets

# key -> (the overrides that make it invalid, a fragment of the one-line error)
INVALID: dict[str, tuple[list[str], str]] = {
    "data.source": (["data.source=bogus"], "data.source = 'bogus' is unknown"),
    "data.path": (['data.path="  "'], "data.path = '  ' is an empty path"),
    "data.n": (["data.n=1"], "data.n = 1: the train set needs at least 2 images"),
    "data.image_size": (["data.image_size=18"], "data.image_size = 18 must be a multiple of 4"),
    "data.subset_index": (["data.subset_index=-1"], "data.subset_index = -1 must be >= 0"),
    "data.order": (["data.order=sorted"], "data.order"),
    "data.order_seed": (["data.order_seed=-1"], "data.order_seed = -1 must be >= 0"),
    "data.n_heldout": (["data.n_heldout=-1"], "data.n_heldout = -1 must be >= 1"),
    "data.cache_dir": (['data.cache_dir=""'], "data.cache_dir = '' is an empty path"),
    "model.width": (["model.width=0"], "model.width = 0 must be >= 1"),
    "model.channel_mult": (["model.channel_mult=[]"], "model.channel_mult = [] must list one multiplier >= 1"),
    "model.layers_per_block": (["model.layers_per_block=0"], "model.layers_per_block = 0 must be >= 1"),
    "model.attention": (["model.attention=3"], "model.attention = 3 has the wrong type: expected bool"),
    "model.attention_heads": (["model.attention_heads=0"], "model.attention_heads = 0 must be >= 1"),
    "model.attention_head_dim": (["model.attention_head_dim=-1"], "model.attention_head_dim = -1 must be 0"),
    "model.norm_groups": (["model.norm_groups=0"], "is not a multiple of model.norm_groups = 0"),
    "model.dropout": (["model.dropout=1.0"], "model.dropout = 1.0 must be in [0, 1)"),
    "model.dropout_type": (["model.dropout_type=pixel"], "model.dropout_type = 'pixel' is unknown"),
    "model.time_embedding": (["model.time_embedding=fourier"], "model.time_embedding = 'fourier' is unknown"),
    "model.time_act": (["model.time_act=relu"], "model.time_act = 'relu' is unknown"),
    "model.init": (["model.init=xavier"], "model.init = 'xavier' is unknown"),
    "diffusion.num_train_timesteps": (["diffusion.num_train_timesteps=1"],
                                      "diffusion.num_train_timesteps = 1 must be in [2, 100000]"),
    "diffusion.beta_start": (["diffusion.beta_start=0.5"], "need 0 < beta_start < beta_end < 1"),
    "diffusion.beta_end": (["diffusion.beta_end=1.5"], "beta_end = 1.5: need 0 < beta_start < beta_end < 1"),
    "diffusion.beta_schedule": (["diffusion.beta_schedule=cosine"], "diffusion.beta_schedule = 'cosine' is unknown"),
    "diffusion.t_min": (["diffusion.t_min=1000"], "diffusion.t_min = 1000 must be in [0, num_train_timesteps"),
    "train.optimizer": (["train.optimizer=sdg"], "train.optimizer = 'sdg' is unknown (did you mean 'sgd'?)"),
    "train.lr": (["train.lr=0"], "train.lr = 0.0 must be > 0"),
    "train.momentum": (["train.momentum=1.0"], "train.momentum = 1.0 must be in [0, 1)"),
    "train.batch_size": (["train.batch_size=0"], "train.batch_size = 0 must be >= 1"),
    "train.steps": (["train.steps=0"], "train.steps = 0 must be > 0"),
    "train.seed": (["train.seed=-1"], "train.seed = -1 must be a seed in [0, 2**63)"),
    "train.device": (["train.device=tpu"], "train.device = 'tpu' is unknown"),
    "train.num_threads": (["train.num_threads=-1"], "train.num_threads = -1 must be >= 0"),
    "train.precision": (["train.precision=fp16"], "train.precision = 'fp16' is unknown"),
    "train.channels_last": (["train.channels_last=yes"], "train.channels_last = 'yes' has the wrong type"),
    "train.tensorboard": (["train.tensorboard=1"], "train.tensorboard = 1 has the wrong type: expected bool"),
    "train.compile": (["train.compile=1"], "train.compile = 1 has the wrong type: expected bool"),
    "train.deterministic": (["train.deterministic=\"on\""], "train.deterministic = 'on' has the wrong type: expected bool"),
    "eval.times": (["eval.times=1000000000000"], "eval.times = 1000000000000 must be a count of log-spaced"),
    "eval.inline": (["eval.inline=no"], "eval.inline = 'no' has the wrong type"),
    "eval.n_samples": (["eval.n_samples=1"], "eval.n_samples = 1 must be >= 2"),
    "eval.sampler": (["eval.sampler=euler"], "eval.sampler = 'euler' is unknown"),
    "eval.sampler_steps": (["eval.sampler_steps=1001"], "eval.sampler_steps = 1001 is more than the 1000 DDPM steps"),
    "eval.sampler_schedule": (["eval.sampler_schedule=trailing"], "eval.sampler_schedule = 'trailing' is unknown"),
    "eval.clip_sample": (["eval.clip_sample=2"], "eval.clip_sample = 2 has the wrong type"),
    "eval.fid_clip_sample": (["eval.fid_clip_sample=2"], "eval.fid_clip_sample = 2 has the wrong type"),
    "eval.batch_size": (["eval.batch_size=0"], "eval.batch_size = 0 must be >= 1"),
    "eval.seed": (["eval.seed=-1"], "eval.seed = -1 must be a seed in [0, 2**63)"),
    "eval.mem_threshold": (["eval.mem_threshold=0"], "eval.mem_threshold = 0.0 must be in (0, 1]"),
    "eval.n_boot": (["eval.n_boot=0"], "eval.n_boot = 0 must be >= 1"),
    "eval.loss_t": (["eval.loss_t=0"], "eval.loss_t = 0.0 must be > 0"),
    "eval.loss_ts": (["eval.loss_ts=[0.1, 0.01]"], "eval.loss_ts = [0.1, 0.01] must be increasing"),
    "eval.loss_noise_draws": (["eval.loss_noise_draws=0"], "eval.loss_noise_draws = 0 must be >= 1"),
    "eval.loss_n_test": (["eval.loss_n_test=0"], "eval.loss_n_test = 0 must be >= 1"),
    "eval.fid": (["eval.fid=yes"], "eval.fid = 'yes' has the wrong type"),
    "eval.fid_extractor": (["eval.fid_extractor=incepton"],
                           "eval.fid_extractor = 'incepton' is unknown (did you mean 'inception'?)"),
    "eval.fid_n_reference": (["eval.fid_n_reference=1"], "eval.fid_n_reference = 1 must be >= 2"),
    "eval.fid_reference_sets": (["eval.fid_reference_sets=0"], "eval.fid_reference_sets = 0 must be >= 1"),
    "eval.fid_boot": (["eval.fid_boot=-1"], "eval.fid_boot = -1 must be >= 0"),
    "eval.checkpoint_ratio": (["eval.checkpoint_ratio=0.5"], "eval.checkpoint_ratio = 0.5 must be 0 (off) or a factor"),
    "eval.refine_ratio": (["eval.refine_ratio=1.5"], "eval.refine_ratio = 1.5 needs kept checkpoints"),
    "eval.refine_n_samples": (["eval.refine_n_samples=1"], "eval.refine_n_samples = 1 must be 0 (off) or >="),
    "eval.stop_f_mem": (["eval.stop_f_mem=2"], "eval.stop_f_mem = 2.0 must be in [0, 1]"),
    "eval.mem_levels": (["eval.mem_levels=[0.1, 0.01]"], "eval.mem_levels = [0.1, 0.01] must be increasing"),
    "eval.bias_levels": (["eval.bias_levels=[0.1, -0.05]"], "eval.bias_levels = [0.1, -0.05] must be increasing"),
    "eval.copy_distances": (["eval.copy_distances=[0.5, 0.3]"], "eval.copy_distances = [0.5, 0.3] must be increasing"),
    "eval.gap_sizes": (["eval.gap_sizes=[0.3, 0.1]"], "eval.gap_sizes = [0.3, 0.1] must be increasing"),
    "eval.fid_weights": (['eval.fid_weights=""'], "eval.fid_weights = '' is an empty path"),
    "sweep.n": (["sweep.n=[1]"], "sweep.n = [1]: every train-set size must be >= 2"),
    "sweep.width": (["sweep.width=[0]"], "sweep.width = [0]: every width must be >= 1"),
    "sweep.seeds": (["sweep.seeds=[-1]"], "sweep.seeds = [-1] must be a seed in [0, 2**63)"),
    "sweep.cells": (["sweep.cells=[[64]]"], "sweep.cells = [[64]]: each cell is [n, width]"),
    "sweep.steps_per_n": (["sweep.steps_per_n=-1"], "sweep.steps_per_n = -1 must be >= 0"),
    "sweep.min_steps": (["sweep.min_steps=-1"], "sweep.min_steps = -1 must be >= 0"),
    "sweep.splits": (["sweep.splits=[-1]"], "sweep.splits = [-1] must list training blocks >= 0"),
    "theory.d": (["theory.d=1"], "theory.d = 1 must be >= 2"),
    "theory.psi_p": (["theory.psi_p=0"], "theory.psi_p = 0.0 must be > 0"),
    "theory.psi_n": (["theory.psi_n=[]"], "theory.psi_n = []: give a list of n / d values"),
    "theory.t": (["theory.t=0"], "theory.t = 0.0 must be a diffusion time in (0, 10]"),
    "theory.seeds": (["theory.seeds=[-1]"], "theory.seeds = [-1] must be a seed in [0, 2**63)"),
    "theory.noise": (["theory.noise=exact"], "theory.noise = 'exact'"),
    "theory.noise_draws": (["theory.noise_draws=0"], "theory.noise_draws must be >= 1"),
    "theory.test_draws": (["theory.test_draws=5"], "theory.test_draws >= 10"),
    "theory.tau_min": (["theory.tau_min=0"], "need 0 < tau_min < tau_max"),
    "theory.tau_max": (["theory.tau_max=0.01"], "need 0 < tau_min < tau_max"),
    "theory.n_tau": (["theory.n_tau=5"], "n_tau = 5: need 0 < tau_min < tau_max and n_tau >= 10"),
    "theory.gap_fraction": (["theory.gap_fraction=1"], "theory.gap_fraction = 1.0 must be in (0, 1)"),
    "theory.spectrum_t": (["theory.spectrum_t=11"], "theory.spectrum_t = 11.0 must be a diffusion time"),
    "theory.spectrum_psi_n": (["theory.spectrum_psi_n=0"], "theory.spectrum_psi_n = 0.0 must give n"),
    "theory.spectrum_noise_draws": (["theory.spectrum_noise_draws=-1"], "theory.spectrum_noise_draws = -1 must be"),
    "theory.device": (["theory.device=tpu"], "theory.device = 'tpu' must be cpu, cuda or auto"),
}

# more invalid values of the keys whose meaning has several sides
MORE_INVALID: list[tuple[list[str], str]] = [
    (["eval.times=0"], "eval.times = 0 must be a count of log-spaced"),
    (["eval.times=papr"], "eval.times = 'papr' is unknown (did you mean 'paper'?)"),
    (["eval.times=[0, 5]"], "eval.times lists steps [0] outside [1, train.steps = 5]"),
    (["eval.times=[]"], "eval.times lists steps [] outside"),
    (["eval.sampler_steps=1"], "eval.sampler_steps = 1: the official DDIM sequence needs >= 2 points"),
    (["diffusion.beta_start=0"], "need 0 < beta_start < beta_end < 1"),
    (["diffusion.beta_start=0.01", "diffusion.beta_end=0.01"], "need 0 < beta_start < beta_end < 1"),
    (["diffusion.num_train_timesteps=1000000"], "must be in [2, 100000]"),
    (["train.steps=10000000000000"], "train.steps = 10000000000000 is more than"),
    (["train.device=cuda:x"], "train.device = 'cuda:x' is unknown"),
    (["train.lr=-1"], "train.lr = -1.0 must be > 0"),
    (["train.lr=1" + "0" * 400], "train.lr = 100000000000... is too large for a number"),
    (["model.channel_mult=[1, 0]"], "model.channel_mult = [1, 0] must list one multiplier >= 1"),
    (["data.source=folder", 'data.path=""'], "data.source = 'folder' needs data.path"),
    (["sweep.splits=[]"], "sweep.splits = [] must list training blocks >= 0"),
    (["sweep.splits=[0, 1, 1]"], "sweep.splits = [0, 1, 1] lists [1] twice"),
    (["sweep.splits=[0, 1]", "data.subset_index=1"], "sweep.splits = [0, 1] sets data.subset_index of every run"),
    # lfw_faces at 16x16 with 36 held out leaves 64 training images: two blocks of 40 do not fit
    (["sweep.splits=[0, 1]", "sweep.n=[40]"], "sweep.splits = [0, 1] needs 2 disjoint train blocks of N = 40"),
]


def all_fields() -> dict[str, type]:
    """``section.key`` -> annotation of every field of every config dataclass."""
    sections = {**config.ALL_SECTIONS, "theory": config.TheoryConfig}
    return {f"{name}.{f.name}": typing.get_type_hints(cls)[f.name] for name, cls in sections.items()
            for f in dataclasses.fields(cls)}


def float_fields() -> list[str]:
    """The keys whose values are floats or lists / tuples of floats."""
    def has_float(tp) -> bool:
        return tp is float or any(has_float(a) for a in typing.get_args(tp))
    return sorted(key for key, tp in all_fields().items() if has_float(tp))


def run_cli(tmp_path, key: str, overrides: list[str], capsys) -> str:
    """The CLI verb that reads ``key``'s section, with ``overrides``; asserts exit 2, one error line on stderr and
    nothing written; returns that line."""
    config_file = tmp_path / "c.toml"
    config_file.write_text("")
    out = tmp_path / "out"
    section = key.split(".")[0]
    if section == "theory":
        argv = ["theory", "sweep", "--out", str(out), *sum((["--set", o] for o in overrides), [])]
    elif section == "sweep":
        argv = ["sweep", str(config_file), "--cluster", "debug", "--out", str(out), "--no-progress",
                *sets(SMOKE + ["sweep.n=[8]"] + overrides)]
    else:
        argv = ["train", str(config_file), "--out", str(out), "--no-progress", *sets(SMOKE + overrides)]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ": error: " in err[0] and "Traceback" not in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
    return err[0]


def test_every_field_of_every_config_dataclass_has_an_invalid_value():
    assert set(INVALID) == set(all_fields())


@pytest.mark.parametrize("key", sorted(INVALID))
def test_an_invalid_value_of_each_key_is_one_line_naming_it(key, tmp_path, capsys):
    overrides, fragment = INVALID[key]
    assert fragment in run_cli(tmp_path, key, overrides, capsys)


@pytest.mark.parametrize("overrides, fragment", MORE_INVALID, ids=[" ".join(o) for o, _ in MORE_INVALID])
def test_more_invalid_values(overrides, fragment, tmp_path, capsys):
    assert fragment in run_cli(tmp_path, overrides[0].split("=")[0], overrides, capsys)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", float_fields())
def test_nan_and_infinity_are_refused_in_every_float_field(key, value, tmp_path, capsys):
    written = value if all_fields()[key] is float else f"[{value}]"
    err = run_cli(tmp_path, key, [f"{key}={written}"], capsys)
    assert f"{key} = {written} is not a finite number (NaN and infinity are refused)" in err


def test_every_fid_extractor_name_the_config_accepts_is_one_the_fid_module_resolves(monkeypatch, tmp_path):
    from diffmem.metrics import fid

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # no Inception weights here: "auto" falls back, "inception" asks
    monkeypatch.delenv(fid.WEIGHTS_ENV_VAR, raising=False)
    for name in config.FID_EXTRACTORS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                resolved, _ = fid.resolve_extractor(name)
        except fid.FIDWeightsError:
            assert name in ("inception", fid.INCEPTION_EXTRACTOR), name
        else:
            assert resolved in (fid.OFFLINE_EXTRACTOR, fid.PIXEL_EXTRACTOR), (name, resolved)
    with pytest.raises(fid.FIDError, match="unknown"):
        fid.resolve_extractor("inception-v4")
