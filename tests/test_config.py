"""Config: defaults are the paper's protocol; TOML + --set overrides; one-line errors for bad keys and types."""
import json
import shutil
from pathlib import Path

import pytest

from diffmem.config import (ConfigError, RunConfig, config_diff, config_from_dict, continuation_diff,
                            keep_recorded_keys, load_config, parse_override)
from diffmem.rundir import RunDir
from diffmem.rundir import check_same_config


def write(tmp_path, text):
    p = tmp_path / "exp.toml"
    p.write_text(text)
    return p


def test_defaults_are_the_papers_protocol():
    cfg = RunConfig()
    assert (cfg.train.optimizer, cfg.train.lr, cfg.train.momentum, cfg.train.batch_size) == ("sgd", 0.01, 0.95, 512)
    assert (cfg.data.image_size, cfg.model.channel_mult, cfg.model.norm_groups, cfg.model.dropout) == (32, (1, 2, 4), 8, 0.1)
    assert (cfg.diffusion.num_train_timesteps, cfg.diffusion.beta_start, cfg.diffusion.beta_end) == (1000, 1e-4, 2e-2)
    assert (cfg.eval.n_samples, cfg.eval.sampler_steps, cfg.eval.mem_threshold, cfg.eval.times) == (10000, 100, 1 / 3,
                                                                                                     "paper")
    assert (cfg.eval.sampler_schedule, cfg.eval.clip_sample, cfg.eval.fid_reference_sets) == ("official", False, 5)
    assert (cfg.model.dropout_type, cfg.model.time_embedding, cfg.model.time_act, cfg.diffusion.t_min) == (
        "channel", "official", "gelu", 1)


def test_effective_batch_is_min_of_batch_and_n(tmp_path):
    cfg, _ = load_config(write(tmp_path, '[data]\nsource = "lfw_faces"\nn = 64\n[train]\nbatch_size = 512\n'))
    assert cfg.batch_size == 64


def test_toml_then_overrides_in_order(tmp_path):
    path = write(tmp_path, '[data]\nsource = "lfw_faces"\nn = 8\n[train]\nlr = 0.5\noptimizer = "sgd"\n'
                           '[sweep]\nn = [8, 16]\n')
    cfg, sweep = load_config(path, ["train.lr=0.001", "train.optimizer=adam", "train.lr=2e-3", "eval.times=[1, 5]",
                                    "model.attention=false"])
    assert cfg.train.lr == 0.002 and cfg.train.optimizer == "adam" and cfg.eval.times == [1, 5]
    assert cfg.model.attention is False and cfg.data.n == 8 and sweep.n == [8, 16]


def test_int_accepted_for_float_but_not_the_reverse(tmp_path):
    cfg, _ = load_config(None, ["data.source=lfw_faces", "train.lr=1"])
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
    with pytest.raises(ConfigError, match="train.steps = 1.5 has the wrong type"):
        load_config(None, ["data.source=lfw_faces", "train.steps=1.5"])


@pytest.mark.parametrize("override, message", [
    ("train.lrr=0.1", r"unknown key 'train.lrr' \(did you mean 'lr'\?\); valid keys of \[train\]: optimizer, lr"),
    ("trian.lr=0.1", r"unknown config section '\[trian\]' \(did you mean 'train'\?\)"),
    ("model.attention=3", r"model.attention = 3 has the wrong type: expected bool"),
    ("train.optimizer=adamw", r"train.optimizer = 'adamw' is unknown \(did you mean 'adam'\?\)"),
    ("train.steps=0", r"train.steps = 0 must be > 0"),
    ("train.lr=-1", r"train.lr = -1.0 must be > 0"),
    ("data.n=1", r"data.n = 1: the train set needs at least 2 images"),
    ("model.width=12", r"model.width = 12 is not a multiple of model.norm_groups = 8"),
    ("data.image_size=30", r"data.image_size = 30 must be a multiple of 4"),
    ("eval.times=[0, 5]", r"eval.times lists steps \[0\] outside"),
    ("trainlr", r"--set expects section.key=value"),
])
def test_bad_values_give_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(None, ["data.source=lfw_faces", override])
    assert "\n" not in str(info.value)


def test_celeba_needs_a_path():
    with pytest.raises(ConfigError, match="needs data.path"):
        load_config(None, [])


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[train\n"))


def test_round_trip_and_diff():
    cfg, _ = load_config(None, ["data.source=lfw_faces", "train.steps=100"])
    assert config_from_dict(cfg.to_dict()) == cfg
    other = cfg.replace(train={"steps": 200, "device": "cpu"})
    assert config_diff(cfg.to_dict(), other.to_dict()) == ["train.steps: 100 -> 200"]


def test_parse_override_literals():
    assert parse_override("eval.fid=false") == ("eval", "fid", False)
    assert parse_override("sweep.n=[8, 16]") == ("sweep", "n", [8, 16])
    assert parse_override('data.path="/a b/c"') == ("data", "path", "/a b/c")
    assert parse_override("data.path=/data/celeba") == ("data", "path", "/data/celeba")


def test_mem_levels_default_round_trip_and_off():
    cfg, _ = load_config(None, ["data.source=lfw_faces"])
    assert cfg.eval.mem_levels == (0.01, 0.1) and cfg.to_dict()["eval"]["mem_levels"] == [0.01, 0.1]
    assert config_from_dict(cfg.to_dict()) == cfg
    off, _ = load_config(None, ["data.source=lfw_faces", "eval.mem_levels=[]"])
    assert off.eval.mem_levels == ()  # no level crossing is read


@pytest.mark.parametrize("levels", ["[0.1, 0.01]", "[0.01, 0.01]", "[0, 0.1]", "[0.5, 1]"])
def test_mem_levels_must_be_increasing_fractions(levels):
    with pytest.raises(ConfigError, match=r"eval.mem_levels = .* must be increasing fractions in \(0, 1\)") as info:
        load_config(None, ["data.source=lfw_faces", f"eval.mem_levels={levels}"])
    assert "\n" not in str(info.value)


def test_a_run_folder_written_before_mem_levels_still_continues(tmp_path):
    """results/cpu_digits/n00128_w08_s0/config.json predates eval.mem_levels, which only the analysis reads: the run
    continues with today's default and with any other levels."""
    committed = Path(__file__).resolve().parents[1] / "results" / "cpu_digits" / "n00128_w08_s0" / "config.json"
    stored = json.loads(committed.read_text())["config"]
    assert "mem_levels" not in stored["eval"]
    cfg = config_from_dict(stored)
    assert cfg.eval.mem_levels == (0.01, 0.1)
    other = cfg.replace(eval={"mem_levels": (0.05,)})
    assert continuation_diff(stored, cfg) == [] and continuation_diff(stored, other) == []
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(committed, run / "config.json")
    assert check_same_config(other, RunDir(run))
    assert continuation_diff(stored, cfg.replace(eval={"mem_threshold": 0.25})) == [
        "eval.mem_threshold: 0.3333333333333333 -> 0.25"]  # a key that changes what is measured is still refused


def test_sweep_cells_add_a_width_axis_at_one_n_of_an_n_axis(tmp_path):
    from diffmem.config import SweepConfig, validate_sweep
    from diffmem.experiment import expand_grid

    base, _ = load_config(None, ["data.source=digits", "data.image_size=8"])
    sweep = SweepConfig(n=[32, 64, 128], width=[8], seeds=[0, 1], cells=[[64, 32], [64, 16], [64, 8]])
    validate_sweep(sweep)
    cells = [(r.cfg.data.n, r.cfg.model.width, r.cfg.train.seed) for r in expand_grid(base, sweep, tmp_path)]
    assert cells == [(32, 8, 0), (32, 8, 1), (64, 8, 0), (64, 8, 1), (128, 8, 0), (128, 8, 1),
                     (64, 16, 0), (64, 16, 1), (64, 32, 0), (64, 32, 1)]  # [64, 8] is already in the product
    for bad in ([[64]], [[1, 8]], [[64, 0]], [[64, 16], [64, 16]]):
        with pytest.raises(ConfigError, match="sweep.cells"):
            validate_sweep(SweepConfig(n=[32], width=[8], cells=bad))
    _, loaded = load_config(None, ["data.source=digits", "data.image_size=8", "sweep.cells=[[64, 16]]"])
    assert loaded.cells == [[64, 16]]


def test_the_config_json_reader_validates_and_knows_the_evaluation_grid(tmp_path):
    """diffmem.rundir.read_config: the one reader of a run folder's config.json. The steps a run certainly
    checkpointed are its grid; after a budget grew, an earlier grid's step counts only if every later grid has it."""
    from diffmem.rundir import ConfigFileError, read_config
    from diffmem.eval_grid import evaluation_steps

    run = RunDir(tmp_path / "run")
    assert read_config(run) is None  # a new run folder
    cfg, _ = load_config(None, ["data.source=lfw_faces", "train.steps=60", "eval.times=6"])
    run.path.mkdir()
    meta = {"config": cfg.to_dict(), "diffmem_version": "0.4.0"}
    run.config_path.write_text(json.dumps(meta))
    stored = read_config(run)
    assert stored.config == cfg and stored.budgets() == [60]
    assert stored.scheduled_steps() == evaluation_steps(6, 60) == [1, 2, 5, 12, 26, 60]
    run.config_path.write_text(json.dumps(meta | {"extended": [{"from_steps": 30, "to_steps": 60}]}))
    assert read_config(run).budgets() == [30, 60]
    assert evaluation_steps(6, 30) == [1, 2, 4, 8, 15, 30]
    assert read_config(run).scheduled_steps() == [1, 2, 60]  # 4, 8, 15, 30 may have been trained under 60
    meta["config"]["eval"]["loss_t"] = float("inf")
    run.config_path.write_text(json.dumps(meta))  # Infinity: JSON as Python writes it
    with pytest.raises(ConfigFileError, match=r"config\.json: eval\.loss_t = inf is not a finite number") as info:
        read_config(run)
    assert "\n" not in str(info.value) and "restore the file from a copy" in str(info.value)


def test_a_run_folder_written_before_model_init_reads_as_diffusers_and_continues_under_todays_default(tmp_path):
    """results/cpu_digits/n00128_w08_s0/config.json predates model.init: it reads as "diffusers" (the init it was
    trained with), and continuing it with today's "official", or another folder's explicit other init, is not a
    difference that refuses the command: the folder keeps its recorded init (keep_recorded_keys)."""
    committed = Path(__file__).resolve().parents[1] / "results" / "cpu_digits" / "n00128_w08_s0" / "config.json"
    stored = json.loads(committed.read_text())["config"]
    assert "init" not in stored["model"]
    recorded = config_from_dict(stored)
    assert recorded.model.init == "diffusers"
    today = recorded.replace(model={"init": "official"})
    assert continuation_diff(stored, today) == []
    assert keep_recorded_keys(stored, today) == recorded
    explicit = today.to_dict()  # a folder written today records its init
    assert keep_recorded_keys(explicit, recorded).model.init == "official"
    assert continuation_diff(explicit, recorded) == []
    assert continuation_diff(stored, today.replace(model={"dropout": 0.2})) == ["model.dropout: 0.1 -> 0.2"]
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(committed, run / "config.json")
    assert check_same_config(today, RunDir(run))


def test_model_init_defaults_to_official_and_accepts_diffusers():
    cfg, _ = load_config(None, ["data.source=lfw_faces"])
    assert cfg.model.init == "official"
    cfg, _ = load_config(None, ["data.source=lfw_faces", "model.init=diffusers"])
    assert cfg.model.init == "diffusers" and config_from_dict(cfg.to_dict()) == cfg
