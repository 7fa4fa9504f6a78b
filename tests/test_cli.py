"""The CLI end to end: --help, prepare + train on a CelebA-layout fixture, one-line errors for bad input, and the
commands that only read run folders starting without torch."""
import json
import subprocess
import sys

import pytest

from diffmem.cli import VERBS, main
from diffmem.rundir import RunDir
from tiny_runs import TINY_CELEBA, sets



def test_help_lists_every_verb_with_a_description():
    out = subprocess.run([sys.executable, "-m", "diffmem.cli", "--help"], capture_output=True, text=True).stdout
    expected = {"prepare", "train", "evaluate", "pairs", "analyze", "advise", "demo", "sweep", "status", "bench",
                "theory", "coverage", "tensorboard"}
    assert set(VERBS) == expected
    for verb in expected:
        assert any(line.split()[:1] == [verb] and len(line.split()) > 3 for line in out.splitlines()), verb


@pytest.mark.e2e
def test_prepare_then_train_on_a_celeba_copy(celeba_root, tmp_path, capsys):
    root = celeba_root(n=30)
    tensor = tmp_path / "celeba8.pt"
    assert main(["prepare", "celeba", "--root", str(root), "--size", "8", "--out", str(tensor)]) == 0
    assert tensor.exists() and tensor.with_suffix(".json").exists()
    config = tmp_path / "c.toml"
    config.write_text("")
    run = tmp_path / "run"
    assert main(["train", str(config), "--out", str(run), "--no-progress",
                 *sets(TINY_CELEBA + [f"data.path={tensor}"])]) == 0
    assert RunDir(run).is_done() and len(RunDir(run).metrics()) == 2
    # data.path may also be the raw root: it is prepared into the cache on first use
    assert main(["train", str(config), "--out", str(tmp_path / "run2"), "--no-progress",
                 *sets(TINY_CELEBA + [f"data.path={root}"])]) == 0
    assert RunDir(tmp_path / "run2").is_done()


@pytest.mark.parametrize("argv, message", [
    (["prepare", "celeba", "--root", "/nonexistent/celeba"], "/nonexistent/celeba"),
    (["train", "CONFIG", "--out", "OUT", "--set", "train.lrr=1"], "did you mean 'lr'"),
    (["train", "CONFIG", "--out", "OUT", "--set", "data.source=lfw_faces", "--set", "data.n=99"], "data.n"),
    (["train", "/no/such.toml", "--out", "OUT"], "does not exist"),
    (["evaluate", "/no/such/run"], "not a run folder"),
    (["pairs", "/no/such/experiment"], "does not exist"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(argv, message, tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text("")
    argv = [str(config) if a == "CONFIG" else str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith(f"diffmem {argv[0]}: error:")
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_analyze_then_advise_from_the_fitted_laws(tmp_path, capsys):
    from diffmem.analysis.synthetic import write_synthetic_experiment

    write_synthetic_experiment(tmp_path / "exp", ns=[128, 256, 512, 1024], widths=[32], seeds=[0, 1],
                               steps=lambda n, w: 3000 * n)
    assert main(["analyze", str(tmp_path / "exp")]) == 0
    out = capsys.readouterr().out
    assert "8 run(s)" in out and "tau_mem_vs_n" in out
    assert (tmp_path / "exp" / "figures" / "scaling.png").stat().st_size > 0
    assert main(["advise", "--n", "2048", "--width", "32", "--from", str(tmp_path / "exp")]) == 0
    advice = capsys.readouterr().out
    assert "Advice for N = 2048, W = 32" in advice and "recommended stop" in advice
    assert "outside" in advice or "extrapolat" in advice  # 2048 lies beyond the fitted N range
    assert main(["advise", "--n", "1024", "--width", "32"]) == 0
    assert "arXiv 2505.17638" in capsys.readouterr().out  # the paper's laws, with their source


HEAVY = ("torch", "torchvision", "diffusers", "torch_fidelity")


@pytest.mark.e2e
def test_the_commands_that_only_read_run_folders_never_import_torch(tmp_path):
    """`diffmem status`, `analyze`, `advise` and `tensorboard` read JSON, CSV and PNG files: they start in about a
    second instead of the five that importing torch and diffusers takes here, and the figures' package imports none
    of them either. (An experiment whose runs wrote copies.jsonl still loads torch in `analyze`: it rebuilds their
    train sets.)"""
    from diffmem.analysis.synthetic import write_synthetic_experiment

    exp = str(tmp_path / "exp")
    write_synthetic_experiment(exp, ns=[128, 256, 512], widths=[32], steps=lambda n, w: 3000 * n)
    script = (f"import json, sys\nfrom diffmem.cli import main\nimport diffmem.figures\n"
              f"codes = [main(['status', {exp!r}]), main(['analyze', {exp!r}, '--no-figures']), "
              f"main(['advise', '--n', '1024', '--width', '32', '--from', {exp!r}]), main(['tensorboard', {exp!r}])]\n"
              f"print(json.dumps({{'codes': codes, 'loaded': [m for m in {HEAVY!r} if m in sys.modules]}}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"codes": [0, 0, 0, 0], "loaded": []}


@pytest.mark.e2e
def test_analyze_no_pdf_draws_png_only_and_removes_the_pdfs_of_an_earlier_drawing(tmp_path, capsys):
    from diffmem.analysis.runfiles import read_figure_index
    from diffmem.analysis.synthetic import write_synthetic_experiment

    exp, figures = tmp_path / "exp", tmp_path / "exp" / "figures"
    write_synthetic_experiment(exp, ns=[64], widths=[8], steps=20_000, n_evals=8,
                               tau_gen=lambda n, w: 500.0, tau_mem=lambda n, w: 20.0 * n)
    assert main(["analyze", str(exp)]) == 0
    drawn = [e["name"] for e in read_figure_index(figures) if not e["skipped"]]
    assert drawn and all((figures / f"{name}.pdf").is_file() for name in drawn)
    assert main(["analyze", str(exp), "--no-pdf"]) == 0
    capsys.readouterr()
    index = [e for e in read_figure_index(figures) if not e["skipped"]]
    assert [e["name"] for e in index] == drawn and all(e["files"] == [f"{e['name']}.png"] for e in index)
    assert not list(figures.glob("*.pdf")) and all((figures / f"{name}.png").stat().st_size > 0 for name in drawn)
    report = (exp / "report.md").read_text()
    assert "[PDF](" not in report and all(f"figures/{name}.png)" in report for name in drawn)
