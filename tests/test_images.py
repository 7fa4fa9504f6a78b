"""Which training images are copied, and when (diffmem.analysis.images, diffmem.figures.images): planted copies
read back exactly as first-copy steps, a run that never copies, identical and near-duplicate training images, the
descriptors against a float64 brute force, the copied fraction's Garwood interval against scipy and its coverage
of planted multinomial draws, Spearman's rho against scipy, the strips of first copies, and `diffmem analyze` on a
planted experiment with copies.jsonl."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import chi2, spearmanr

from diffmem.analysis.images import (DESCRIPTORS, IMAGE_COLUMNS, SUMMARY_IMAGE_COLUMNS, descriptor_sentence,
                                     distinct_interval, seed_stability, spearman_interval,
                                     spearman_rows, timeline)
from diffmem.analysis.runfiles import read_csv, read_json
from diffmem.analysis.synthetic import write_planted_copies, write_synthetic_experiment
from diffmem.figures.checks import figure_problems
from diffmem.metrics.memorization import copy_counts, memorized_fraction, nearest_k
from diffmem.results import write_results
from diffmem.rundir import RunDir


def _train(n: int = 12, d: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.rand((n, d), generator=torch.Generator().manual_seed(seed)) - 0.5


def _line(step: int, samples: torch.Tensor, train: torch.Tensor) -> dict:
    """A copies.jsonl line through the evaluation's own path."""
    counts = copy_counts(memorized_fraction(samples, train, n_boot=1))
    return {"step": step, "n_samples": len(samples), "seed": 0, "mem_threshold": 1 / 3, "n_train": len(train),
            "nearest_idx": counts.nearest_idx, "nearest_n": counts.nearest_n, "copied_idx": counts.copied_idx,
            "copied_n": counts.copied_n}


def _samples(train: torch.Tensor, copied: list[int], n: int, seed: int) -> torch.Tensor:
    noise = torch.rand((n - len(copied), train.shape[1]), generator=torch.Generator().manual_seed(seed)) * 4 - 2
    return torch.cat([train[copied], noise]) if copied else noise


def test_planted_copies_are_read_back_as_first_copy_steps():
    train = _train()
    plan = {3: 10, 5: 10, 7: 40}  # image -> the step from which it is copied
    lines = []
    for step in (1, 10, 20, 40, 80):
        lines.append(_line(step, _samples(train, [i for i, s in plan.items() if s <= step], 64, step), train))
    lines.append(_line(30, _samples(train, [3, 5, 9], 256, 30), train))  # a refinement evaluation: more samples
    lines.append(_line(80, _samples(train, [3, 5, 7, 7], 64, 99), train))  # step 80 evaluated again: latest wins
    tl = timeline(lines, len(train), 64)
    first = {i: tl.first_copy_step[i] for i in range(len(train)) if math.isfinite(tl.first_copy_step[i])}
    assert first == {3: 10, 5: 10, 7: 40, 9: 30}
    assert tl.first_copy_bracket_lo[[3, 7, 9]].tolist() == [1, 30, 20]  # the evaluated step before: refinement too
    assert tl.first_copy_n_samples[[3, 9]].tolist() == [64, 256]
    assert tl.steps.tolist() == [1, 10, 20, 40, 80]  # the curves use the base evaluations only
    assert tl.copied[-1, 7] == 2 and tl.copied[:, 3].tolist() == [0, 1, 1, 1, 1] and tl.copied[:, 9].sum() == 0
    assert (tl.copied > 0).sum(1).tolist() == [0, 2, 2, 3, 3]


def test_a_run_that_never_copies_has_an_empty_timeline():
    train = _train()
    lines = [_line(step, _samples(train, [], 32, step), train) for step in (1, 10, 100)]
    tl = timeline(lines, len(train), 32)
    assert np.isinf(tl.first_copy_step).all() and np.isnan(tl.first_copy_bracket_lo).all()
    assert tl.copied.sum() == 0
    corr = spearman_interval(tl.first_copy_step, np.arange(len(train), dtype=float))
    assert corr.rho is None and corr.lo is None  # no order to relate
    assert "no detectable relation" in descriptor_sentence("nn_train_distance", corr.to_dict())


def test_identical_training_images_are_never_copies_and_near_duplicates_are_close():
    train = _train(8)
    train[1] = train[0]  # identical pair: a copy of either is d1 = d2, ratio 1
    train[3] = train[2] + 1e-3  # near-duplicate pair: an exact copy of one is d1 = 0 < d2 / 3
    line = _line(5, train[[0, 1, 2]], train)
    assert line["copied_idx"] == [2]
    assert 0 in line["nearest_idx"] and 1 not in line["nearest_idx"]  # ties go to the lowest index
    near = nearest_k(train, train, 2, exclude_self=True)[0].numpy()
    assert near[0, 0] == 0.0 and near[1, 0] == 0.0  # the other identical image, not itself
    assert near[2, 0] == pytest.approx(1e-3 * math.sqrt(train.shape[1]), rel=1e-3)
    assert near[4:, 0].min() > 0.5


def test_the_garwood_interval_equals_scipy_and_is_capped():
    lo, hi = distinct_interval(7, 1000)
    assert lo == pytest.approx(chi2.ppf(0.025, 14) / 2) and hi == pytest.approx(chi2.ppf(0.975, 16) / 2)
    assert distinct_interval(0, 1000) == (0.0, pytest.approx(-math.log(0.025)))  # k = 0: [0, 3.69]
    assert distinct_interval(9, 10)[1] == 10.0  # never more images than the train set holds


@pytest.mark.parametrize("n_train, n_samples, copy_share, zipf", [
    (64, 1000, 0.002, 1.0),  # a handful of copies, mostly one per image
    (64, 1000, 0.05, 1.0),  # tens of copies on a skewed set of images
    (256, 1000, 0.01, 0.0),  # uniform over images, mostly singletons
    (32, 10000, 0.02, 2.0),  # refinement counts: few images, many copies each
])
def test_the_copied_fraction_interval_covers_the_expected_fraction_of_planted_multinomial_draws(
        n_train, n_samples, copy_share, zipf):
    """Planted: each sample copies image i with probability p_i (Zipf-like shares summing to copy_share), else
    nothing; the estimand E[D] = sum_i 1 - (1 - p_i)^n exactly. 2000 draws: coverage at least 95 % minus 2 binomial
    standard errors (the interval is meant to be conservative)."""
    rng = np.random.default_rng(0)
    weights = 1.0 / np.arange(1, n_train + 1) ** zipf
    p = copy_share * weights / weights.sum()
    expected = float(np.sum(1 - (1 - p) ** n_samples))
    counts = rng.multinomial(n_samples, np.append(p, 1 - p.sum()), size=2000)[:, :n_train]
    distinct = (counts > 0).sum(1)
    ends = np.array([distinct_interval(int(d), n_train) for d in distinct])
    coverage = np.mean((ends[:, 0] <= expected) & (expected <= ends[:, 1]))
    assert coverage >= 0.95 - 2 * math.sqrt(0.95 * 0.05 / 2000), (coverage, expected)


def test_spearman_with_ties_and_never_copied_equals_scipy():
    rng = np.random.default_rng(3)
    first = rng.choice([10.0, 20.0, 40.0, math.inf], size=(5, 30))
    other = rng.choice([1.0, 2.0, 3.0], size=(5, 30))
    for a, b, rho in zip(first, other, spearman_rows(first, other)):
        assert rho == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)
    corr = spearman_interval(first[0], other[0])
    assert corr.rho == pytest.approx(spearmanr(first[0], other[0]).statistic)
    assert corr.lo <= corr.rho <= corr.hi and corr.n_images == 30
    pooled = spearman_interval(first[:2], np.broadcast_to(other[0], (2, 30)))  # every (image, seed)
    assert pooled.rho == pytest.approx(spearmanr(first[:2].ravel(), np.tile(other[0], 2)).statistic)
    same = seed_stability(np.stack([first[0]] * 3))
    assert (same.rho, same.lo, same.hi) == (pytest.approx(1.0), pytest.approx(1.0), pytest.approx(1.0))
    assert seed_stability(first[:1]) is None


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """Digits, W = 8, N = 16 and 32 with two seeds each: images 0-3 copied from the 3rd evaluation, 4-5 from the
    6th, the rest never; N = 32 seed 1 without copies.jsonl (a folder from before it), N = 16 seed 0 with a torn
    last copies line and a refinement evaluation."""
    root = tmp_path_factory.mktemp("images")
    planted = write_synthetic_experiment(root, [16, 32], widths=[8], seeds=[0, 1], steps=10_000, n_evals=7,
                                         n_samples=64, tau_gen=lambda n, w: 300.0, tau_mem=lambda n, w: 2000.0)
    steps = [int(r["step"]) for r in RunDir(planted[0].path).metrics()]
    plan = {i: steps[2] for i in range(4)} | {4: steps[5], 5: steps[5]}
    for run in planted:
        if (run.n, run.seed) != (32, 1):
            write_planted_copies(run.path, plan, copies_per_image=2, noise_seed=run.seed,
                                 refinements=[(steps[1], 128)] if (run.n, run.seed) == (16, 0) else ())
    torn = planted[0].path / "copies.jsonl"
    torn.write_text(torn.read_text() + '{"step": 99, "n_sam')
    with pytest.warns(UserWarning, match="copies.jsonl: skipping a truncated last line"):
        summary = write_results(root, pdf=False)
    return root, planted, steps, plan, summary


@pytest.mark.e2e
@pytest.mark.xdist_group("images")  # one worker builds the planted experiment once
def test_analyze_writes_the_image_tables_and_the_report_section(experiment):
    root, planted, steps, plan, _ = experiment
    for run in planted:
        path = root / "images" / f"{run.name}.csv"
        if (run.n, run.seed) == (32, 1):
            assert not path.exists()  # no copies.jsonl: no table, no error
            continue
        rows = read_csv(path)
        assert list(rows[0]) == list(IMAGE_COLUMNS) and len(rows) == run.n
        assert {r["index"]: r["first_copy_step"] for r in rows if r["first_copy_step"] is not None} == plan
        assert rows[4]["first_copy_bracket_lo"] == steps[4] and rows[0]["first_copy_bracket_lo"] == steps[1]
        assert rows[0]["copies_last"] == 2 and rows[0]["evals_copied"] == len(steps) - 2
        assert all(r[d] is not None and r[d] > 0 for r in rows for d in DESCRIPTORS)
    assert (root / "n00016_w08_s0" / "copies.jsonl").read_text().endswith('"n_sam')  # torn line skipped, left as is
    summary = {r["run"]: r for r in read_csv(root / "summary.csv")}
    assert set(SUMMARY_IMAGE_COLUMNS) <= set(summary["n00016_w08_s0"])
    assert summary["n00016_w08_s0"]["images_copied"] == 6
    assert summary["n00016_w08_s0"]["copied_fraction_final"] == pytest.approx(6 / 16)
    assert summary["n00032_w08_s1"]["images_copied"] is None
    section = read_json(root / "fits.json")["images"]
    cells = {(c["n"], c["width"]): c for c in section["cells"]}
    assert cells[(16, 8)]["seed_stability"]["rho"] == pytest.approx(1.0)  # both seeds copy the planted images
    assert cells[(16, 8)]["copied_fraction"]["mean"][-1] == pytest.approx(6 / 16)
    assert section["n_stability"][0]["shared_images"] == 16 and section["n_stability"][0]["rho"] == pytest.approx(1)
    text = (root / "report.md").read_text()
    assert "## Which images are copied" in text and "- N = 16, W = 8 (2 seed(s))" in text


@pytest.mark.e2e
@pytest.mark.xdist_group("images")
def test_image_figures_are_drawn_and_readable(experiment):
    root, _, _, _, summary = experiment
    drawn = {f.name: f for f in summary.figures}
    for name in ("copied_fraction", "first_copy", "copied_images_n00016_w08", "copied_images_n00032_w08"):
        assert drawn[name].skipped is None and (root / "figures" / f"{name}.png").is_file()
        assert figure_problems(drawn[name].figure, expect_intervals=name == "copied_fraction", name=name) == []
    gallery = drawn["copied_images_n00016_w08"].figure
    assert "beside its first copy" in gallery._suptitle.get_text()  # the planted runs stored their first copies
    shown = [im.get_array() for sub in gallery.subfigs for ax in sub.axes for im in ax.get_images()]
    assert shown and all(a.shape[1] == 2 * a.shape[0] + 1 for a in shown)  # each image beside its copy
    assert "![copied_fraction](figures/copied_fraction.png)" in (root / "report.md").read_text()


@pytest.mark.e2e
def test_an_experiment_without_copies_has_no_image_output(tmp_path):
    write_synthetic_experiment(tmp_path, [16], widths=[8], steps=1000, n_evals=5, tau_gen=lambda n, w: 100.0,
                               tau_mem=lambda n, w: 500.0)
    summary = write_results(tmp_path, pdf=False)
    assert not (tmp_path / "images").exists() and "images" not in json.loads((tmp_path / "fits.json").read_text())
    assert "Which images" not in (tmp_path / "report.md").read_text()
    assert not any(f.name.startswith(("copied", "first_copy")) for f in summary.figures)


@pytest.mark.e2e
def test_analyze_refuses_a_damaged_copies_line_in_one_line_and_writes_nothing(tmp_path, capsys):
    from diffmem.cli import main
    planted = write_synthetic_experiment(tmp_path, [16], widths=[8], seeds=[0], steps=10_000, n_evals=5,
                                         n_samples=64, tau_gen=lambda n, w: 300.0, tau_mem=lambda n, w: 2000.0)
    write_planted_copies(planted[0].path, {0: 2000}, copies_per_image=2)
    path = planted[0].path / "copies.jsonl"
    lines = path.read_text().splitlines()
    line = json.loads(lines[1])
    lines[1] = json.dumps(line | {"nearest": line["copied"]})  # the nearest counts no longer sum to n_samples
    path.write_text("\n".join(lines) + "\n")
    assert main(["analyze", str(tmp_path), "--no-figures"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "copies.jsonl line 2: 'nearest_n' sums to" in err, err
    assert not (tmp_path / "summary.csv").exists() and not (tmp_path / "images").exists()


def test_the_first_copies_are_stored_once_each_and_read_back_as_tiles(tmp_path):
    """The evaluation's writer (append_copies): the images a step copies that no earlier step copied, one copy each,
    in a strip beside the counts; the gallery's reader gives the tiles back, and refuses a strip of another shape."""
    from diffmem.copyrecord import CopyHistory, append_copies
    from diffmem.samplegrid import read_first_copies
    planted = write_synthetic_experiment(tmp_path, [16], widths=[8], seeds=[0], steps=10_000, n_evals=5,
                                         n_samples=64, tau_gen=lambda n, w: 300.0, tau_mem=lambda n, w: 2000.0)
    run = RunDir(planted[0].path)
    train = _train(16, 64, 3)
    mean = torch.zeros(())
    history = None
    for step, copied in ((10, [2]), (30, [5, 11]), (20, [2, 5, 9])):  # 20: a refinement between 10 and 30
        samples = _samples(train, copied, 64, step).reshape(-1, 1, 8, 8)
        # the first evaluation reads copies.jsonl, the next ones keep the history as the evaluator does
        history = CopyHistory(run) if history is None else history
        line = append_copies(run, memorized_fraction(samples, train, n_boot=1), samples, mean, step, 0, 16, history)
        assert line["first_copies"] == {10: [2], 20: [5, 9], 30: [5, 11]}[step]
        assert all(CopyHistory(run).before(s) == history.before(s) for s in (10, 20, 25, 30, 40))  # as re-read
    tiles = read_first_copies(run.first_copies_path(20), 2, 8)
    assert tiles.shape == (2, 3, 8, 8)
    expected = (train[9].clamp(0, 1).reshape(8, 8) * 255).round()
    assert (tiles[1, 0].float() - expected).abs().max() <= 1  # image 9's copy, second in the strip
    assert read_first_copies(run.first_copies_path(20), 3, 8) is None  # not 3 tiles: refused, not guessed
    assert read_first_copies(run.first_copies_path(40), 1, 8) is None  # no strip at that step
    assert [line.get("first_copies") for line in run.copies()] == [[2], [5, 11], [5, 9]]


@pytest.mark.e2e
def test_data_that_are_not_those_the_run_trained_on_give_no_descriptors_and_no_gallery(tmp_path):
    """Two seeds of one cell share their train set; seed 0's config.json records other data: its descriptors are
    left out with the reason, seed 1 keeps its own, and the gallery is drawn from seed 1; with both seeds' data
    other, the gallery is skipped naming both."""
    planted = write_synthetic_experiment(tmp_path, [16], widths=[8], seeds=[0, 1], steps=4000, n_evals=5,
                                         n_samples=64, tau_gen=lambda n, w: 300.0, tau_mem=lambda n, w: 1000.0)
    steps = [int(r["step"]) for r in RunDir(planted[0].path).metrics()]
    for run in planted:
        write_planted_copies(run.path, {0: steps[2], 1: steps[2], 2: steps[3]}, copies_per_image=2,
                             noise_seed=run.seed)
    config = planted[0].path / "config.json"
    meta = json.loads(config.read_text())
    config.write_text(json.dumps({**meta, "dataset_sha256": "0" * 64}))  # seed 0 trained on other data
    summary = write_results(tmp_path, pdf=False)
    other, good = (read_csv(tmp_path / "images" / f"{run.name}.csv") for run in planted)
    assert [r["first_copy_step"] for r in other[:3]] == [steps[2], steps[2], steps[3]]  # the copies still read
    assert all(r[d] is None for r in other for d in DESCRIPTORS)
    assert all(r[d] is not None for r in good for d in DESCRIPTORS)
    cell = read_json(tmp_path / "fits.json")["images"]["cells"][0]
    assert "differ from those the run trained on (sha256" in cell["descriptors_note"]
    gallery = {f.name: f for f in summary.figures}["copied_images_n00016_w08"]
    assert gallery.skipped is None and gallery.figure._suptitle.get_text().startswith(f"{planted[1].name}:")
    config = planted[1].path / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "dataset_sha256": "1" * 64}))
    gallery = {f.name: f for f in write_results(tmp_path, pdf=False).figures}["copied_images_n00016_w08"]
    assert gallery.figure is None and all(f"{run.name}: the training images cannot be loaded (the data found"
                                          in gallery.skipped for run in planted)


# --- the fixed-distance copy rules -----------------------------------------------------------------------------------

def test_the_distance_scale_and_the_fixed_distance_counts_equal_a_brute_force_reference():
    from diffmem.metrics.memorization import copied_within, median_neighbour_distance

    rng = torch.Generator().manual_seed(0)
    train = torch.rand(12, 1, 4, 4, generator=rng, dtype=torch.float64)
    samples = torch.cat([train[:5] + 0.01 * torch.rand(5, 1, 4, 4, generator=rng, dtype=torch.float64),
                         torch.rand(20, 1, 4, 4, generator=rng, dtype=torch.float64)])
    d = torch.cdist(train.reshape(12, -1), train.reshape(12, -1)) + torch.diag(torch.full((12,), float("inf")))
    scale = median_neighbour_distance(train)
    assert scale == pytest.approx(float(d.min(1).values.median()), rel=1e-12)
    result = memorized_fraction(samples, train, n_boot=10)
    ds = torch.cdist(samples.reshape(25, -1), train.reshape(12, -1))
    d1, idx1 = ds.min(1)
    for f in (0.1, 0.3, 0.5):
        expected = np.bincount(idx1[d1 < f * scale].numpy(), minlength=12)
        assert np.array_equal(copied_within(result, 12, f * scale), expected)


@pytest.mark.e2e
def test_a_run_records_the_fixed_distance_rules_and_a_damaged_one_is_one_record_error(tmp_path):
    from diffmem.rundir.records import RecordError, within_counts
    from diffmem.train import train as train_run
    from tiny_runs import SMOKE, tiny_config

    cfg = tiny_config("data.n=8", "eval.times=2", "eval.fid=false", "train.num_threads=1", "eval.loss_ts=[]",
                      base=SMOKE)
    run = RunDir(tmp_path / "run")
    train_run(cfg, run.path, progress=False)
    for line in run.copies():
        counts = within_counts(line)
        assert line["copy_distances"] == list(cfg.eval.copy_distances) and line["distance_scale"] > 0
        assert len(counts) == 3 and all(a.sum() <= line["n_samples"] for a in counts)
        assert all((a <= b).all() for a, b in zip(counts, counts[1:]))  # a wider distance copies at least as often
    lines = run.copies_path.read_text().splitlines()
    damaged = json.loads(lines[0]) | {"copy_distances": [0.5, 0.3, 0.4]}
    run.copies_path.write_text("\n".join([json.dumps(damaged), *lines[1:]]) + "\n")
    with pytest.raises(RecordError, match="line 1: 'copy_distances' is not a list of increasing"):
        run.copies()


@pytest.mark.e2e
def test_the_copy_rule_table_reads_every_recorded_rule_from_the_base_evaluations(tmp_path):
    from diffmem.analysis import analyze
    from diffmem.analysis.copy_rules import first_copy_steps
    from diffmem.analysis.report import report_text
    from diffmem.train import train as train_run
    from tiny_runs import SMOKE, tiny_config

    cfg = tiny_config("data.n=8", "eval.times=3", "eval.fid=false", "train.num_threads=1", "eval.loss_ts=[]",
                      base=SMOKE)
    train_run(cfg, tmp_path / "n00008_w04_s0", progress=False)
    analyze(tmp_path)
    section = read_json(tmp_path / "fits.json")["copy_rules"]
    (entry,) = section["runs"].values()
    assert list(entry["rules"]) == ["ratio 0.333", "d1 < 0.3 D", "d1 < 0.4 D", "d1 < 0.5 D"]
    assert entry["base_evaluations"] == len(RunDir(tmp_path / "n00008_w04_s0").copies())
    copied = [r["images_copied"] for r in entry["rules"].values()][1:]
    assert copied == sorted(copied)  # a wider distance copies at least the images a narrower one does
    assert "order of first copies under each copy rule" in report_text(tmp_path)
    assert first_copy_steps([1, 2, 4], np.array([[0, 1, 0], [1, 0, 0], [3, 2, 0]])).tolist() == [2, 1, math.inf]


@pytest.mark.unit
def test_the_cells_seed_interval_covers_the_mean_over_seeds_and_the_sampling_interval_does_not():
    """Seeds differ in which images they copy: each seed's expected fraction q_s ~ Beta(2, 3) (mean 0.4), and an
    evaluation of N = 16 images copies D_s ~ Binomial(16, q_s). Over 2000 draws of 3 seeds, the Student t interval
    over the seeds covers the mean 0.4 in at least 92 % of them; the Garwood interval of the summed count, which
    sees the sampling noise only, covers it far less often."""
    from diffmem.analysis.images import distinct_interval, seed_interval

    rng = np.random.default_rng(0)
    t_cover = garwood_cover = 0
    draws = 2000
    for _ in range(draws):
        q = rng.beta(2, 3, size=3)
        d = rng.binomial(16, q)
        lo, hi = seed_interval(d / 16)
        t_cover += lo <= 0.4 <= hi
        g_lo, g_hi = (v / 48 for v in distinct_interval(int(d.sum()), 48))
        garwood_cover += g_lo <= 0.4 <= g_hi
    assert t_cover / draws >= 0.92 and garwood_cover / draws < t_cover / draws - 0.05
