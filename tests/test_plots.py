"""Figures from files on disk: every figure is written (PNG + PDF, non-empty) or skipped with a reason."""
from __future__ import annotations

import pytest

from diffmem import plots
from diffmem.analysis import analyze
from diffmem.analysis.synthetic import write_synthetic_experiment, write_synthetic_run

ALL_FIGURES = {"window_w08", "window_w32", "collapse", "scaling", "width", "phase", "loss_gap"}


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """Two widths, three N, one seed, plus a run that never memorizes; analyzed with figures."""
    root = tmp_path_factory.mktemp("plots")
    write_synthetic_experiment(root, [128, 512, 2048], widths=[8, 32], steps=1_000_000, n_evals=24)
    write_synthetic_run(root / "n04096_w32_s0", n=4096, width=32, steps=200_000, tau_gen=1e5, tau_mem=None,
                        n_evals=20)
    return root, analyze(root)


def test_every_figure_is_written_as_png_and_pdf(experiment):
    root, summary = experiment
    results = {r.name: r for r in summary.figures}
    assert set(results) == ALL_FIGURES
    for result in results.values():
        assert result.skipped is None, result
        assert [p.suffix for p in result.files] == [".png", ".pdf"]
        for path in result.files:
            assert path.parent == root / "figures" and path.stat().st_size > 5000
        assert result.files[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert result.files[1].read_bytes()[:5] == b"%PDF-"
    assert "figure scaling" in summary.format()


def test_figures_without_data_are_skipped_with_a_reason(tmp_path):
    write_synthetic_experiment(tmp_path, [64, 256], widths=[16], steps=50_000, n_evals=12, record_fid=False,
                               record_losses=False, tau_gen=lambda n, w: 2e3, tau_mem=lambda n, w: 30.0 * n)
    analyze(tmp_path, figures=False)
    data = plots.load_experiment_files(tmp_path)
    out = tmp_path / "figures"
    out.mkdir()
    width = plots.plot_width(data, out)
    assert width.skipped and "one width" in width.skipped and not width.files
    loss = plots.plot_loss_gap(data, out)
    assert loss.skipped and "loss" in loss.skipped
    window = plots.plot_window(data, 16, out)  # f_mem only: still drawn
    assert window.skipped is None and all(p.stat().st_size > 0 for p in window.files)


def test_quality_axis_label_names_the_extractor(tmp_path):
    run = write_synthetic_run(tmp_path / "r", n=32, width=8, steps=1000, tau_gen=100, tau_mem=300, n_evals=8,
                              fid_extractor="diffmem-randconv-v1")
    inception = write_synthetic_run(tmp_path / "s", n=32, width=8, steps=1000, tau_gen=100, tau_mem=300, n_evals=8)
    from diffmem.analysis.runfiles import read_run

    assert plots._quality_label([read_run(run.path)]) == "FD (diffmem-randconv-v1)"
    assert plots._quality_label([read_run(inception.path)]) == "FID"
    assert "mixed" in plots._quality_label([read_run(run.path), read_run(inception.path)])


def test_phase_classification_and_interpolation(experiment):
    root, _ = experiment
    from diffmem.analysis.runfiles import read_run

    record = read_run(root / "n00128_w32_s0")
    assert plots.f_mem_at(record, 1.0) == record.series("f_mem")[0]
    assert plots.f_mem_at(record, 1e9) is None
    assert plots.f_mem_at(record, 9e5) > 0.5  # planted tau_mem = 300 * 128
    assert plots.classify_phase(None, 10, 5, 0.01) == "not trained that long"
    assert plots.classify_phase(0.2, 10, 5, 0.01) == "memorizing"
    assert plots.classify_phase(0.0, 10, 5, 0.01) == "generalizing"
    assert plots.classify_phase(0.0, 1, 5, 0.01) == "learning (before tau_gen)"
    assert plots.classify_phase(0.0, 1, None, 0.01) == "not memorizing (tau_gen unconfirmed)"
    assert plots.classify_phase(0.0, 10, 5, 0.01, tau_gen_is_bound=True) == "not memorizing (tau_gen unconfirmed)"


def test_figures_need_the_summary(tmp_path):
    write_synthetic_run(tmp_path / "r", n=32, width=8, steps=1000, tau_gen=100, tau_mem=300, n_evals=8)
    with pytest.raises(plots.PlotError, match="diffmem analyze"):
        plots.make_figures(tmp_path)
