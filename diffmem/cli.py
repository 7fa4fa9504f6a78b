"""``diffmem <verb>``: thin entry points that parse flags into configs and call the library.

Every error a user can cause ends as one line on stderr and a non-zero exit; ``--debug`` shows the traceback.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

from diffmem import __version__
from diffmem.config import TRAIN_PRECISIONS, TrainConfig, demo_config_path

VERBS = {
    "prepare": "turn a local CelebA copy or image folder into one cached uint8 tensor + manifest",
    "train": "train one run folder (continues a partial run, skips a finished one)",
    "evaluate": "evaluate every checkpoint of a run folder that has no metrics line yet",
    "pairs": "split pairs of an experiment folder: both models sampled from the same noise -> pairs.jsonl",
    "analyze": "all runs of an experiment folder -> summary.csv, fits.json, figures/",
    "advise": "predicted tau_gen and tau_mem for (N, W) and when to stop training",
    "demo": "the embedded CPU demo: a small N sweep on built-in digits, the analysis, an advice and its check",
    "sweep": "run or submit every unfinished run of an experiment's grid (debug | local | slurm, via submitit)",
    "status": "where every run of an experiment folder stands: step, f_mem, FID, state, job ids, logs",
    "tensorboard": "TensorBoard event files of an experiment folder's runs and pairs, from their files",
    "bench": "time training steps, DDIM sampling or one evaluation; the last output line is one JSON object",
    "theory": "the random-features model of the paper: exact dynamics, spectrum, timescales over psi_n",
    "coverage": "the fit interval's coverage study: planted power laws reported as brackets of the grids sweeps use",
}


GRID_NAMES = ("independent", "shared", "paper", "suite")
"""The grids of `diffmem coverage` (diffmem.analysis.coverage.GRIDS; named here so the parser needs no import)."""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line on stderr (the default format adds the source line that raised them)."""
    print(f"diffmem: warning: {message}", file=file or sys.stderr)


def _config_args(p: argparse.ArgumentParser, config_required: bool = True) -> None:
    if config_required:
        p.add_argument("config", help="TOML experiment file (sections [data] [model] [diffusion] [train] [eval])")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config key (repeatable; TOML literal values, e.g. --set train.lr=0.001)")
    p.add_argument("--fid-weights", metavar="PATH",
                   help="local Inception weights file for standard FID (or set DIFFMEM_FID_WEIGHTS)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diffmem",
        description="Measure when diffusion models start to copy their training data "
                    "(Bonnaire et al. 2025, arXiv 2505.17638).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="verbs:\n" + "\n".join(f"  {k:<10} {v}" for k, v in VERBS.items()),
    )
    parser.add_argument("--version", action="version", version=f"diffmem {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    p = sub.add_parser("prepare", help=VERBS["prepare"], description=VERBS["prepare"])
    p.add_argument("source", choices=["celeba", "folder"], help="celeba: torchvision's CelebA layout; "
                   "folder: a plain folder of images")
    p.add_argument("--root", required=True, help="the CelebA root (holding img_align_celeba/ or "
                   "celeba/img_align_celeba/) or the image folder")
    p.add_argument("--size", type=int, default=32, help="image side after Resize + CenterCrop (default 32)")
    p.add_argument("--out", help="output tensor file (default: in the cache folder, $DIFFMEM_CACHE or "
                   "~/.cache/diffmem)")
    p.add_argument("--skip-bad", action="store_true", help="skip unreadable images (counted in the manifest)")

    p = sub.add_parser("train", help=VERBS["train"], description=VERBS["train"])
    _config_args(p)
    p.add_argument("--out", required=True, help="the run folder")

    p = sub.add_parser("evaluate", help=VERBS["evaluate"], description=VERBS["evaluate"])
    p.add_argument("run_dir", help="a run folder written by `diffmem train`")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--fid-weights", metavar="PATH", help="local Inception weights file")
    p.add_argument("--kept", action="store_true",
                   help="also evaluate every kept checkpoint between the evaluation steps (eval.checkpoint_ratio)")
    p.add_argument("--refine-n-samples", type=_positive_int, metavar="M",
                   help="refine a finished run's brackets with M samples per evaluation (eval.refine_n_samples; "
                   "tau_mem's clean end is re-measured with them); the run's config.json is not changed")

    p = sub.add_parser("pairs", help=VERBS["pairs"], description=VERBS["pairs"])
    p.add_argument("experiment_dir", help="an experiment folder with split pairs (sweep.splits = [0, 1])")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--n-samples", type=_positive_int, metavar="M",
                   help="samples per model and step (default: the runs' eval.n_samples); steps already in "
                        "pairs.jsonl are kept as they are")
    p.add_argument("--no-refine", action="store_true",
                   help="only the evaluation grid's steps: do not narrow tau_bias's bracket with kept checkpoints "
                        "(done by default when the runs set eval.refine_ratio and both members have finished)")

    p = sub.add_parser("analyze", help=VERBS["analyze"], description=VERBS["analyze"])
    p.add_argument("experiment_dir", help="a folder of run folders (or one run folder)")
    p.add_argument("--no-figures", action="store_true", help="write summary.csv and fits.json only")
    p.add_argument("--no-pdf", action="store_true",
                   help="draw the figures as PNG only (the report shows the PNGs), in about half the time, e.g. "
                        "while a sweep runs; an older PDF of each figure drawn is removed")
    p.add_argument("--out", metavar="DIR", help="write summary.csv and fits.json into this existing folder instead "
                   "(no figures)")
    p.add_argument("--n-samples", type=_positive_int, metavar="M",
                   help="use only the evaluations that drew M samples (e.g. the grid's, without refinement's)")

    p = sub.add_parser("advise", help=VERBS["advise"], description=VERBS["advise"])
    p.add_argument("--n", type=int, required=True, help="train-set size N")
    p.add_argument("--width", type=int, required=True, help="U-Net base width W")
    p.add_argument("--from", dest="source", metavar="EXPERIMENT_DIR",
                   help="use the laws fitted by `diffmem analyze` there (default: the paper's laws)")

    p = sub.add_parser("demo", help=VERBS["demo"], description=VERBS["demo"])
    _config_args(p, config_required=False)
    p.add_argument("--config", dest="config", default=None,
                   help="experiment file (default: experiments/demo.toml of this checkout)")
    p.add_argument("--out", default="runs/demo", help="experiment folder (default runs/demo)")
    p.add_argument("--quick", action="store_true",
                   help="a few-minute version with tiny budgets, which the test suite runs")
    p.add_argument("--jobs", type=int, default=None, help="runs trained at once (default: one per CPU core)")

    p = sub.add_parser("sweep", help=VERBS["sweep"], description=VERBS["sweep"])
    _config_args(p)
    p.add_argument("--cluster", required=True, choices=["debug", "local", "slurm"],
                   help="debug: in this process, one run after another; local: jobs on this machine; slurm: one "
                        "job array")
    p.add_argument("--out", help="experiment folder (default runs/<experiment file stem>)")
    p.add_argument("--dry-run", action="store_true",
                   help="list every run with its folder and state (and the sbatch script for slurm); submit nothing")
    p.add_argument("--max-parallel", type=int, metavar="K",
                   help="jobs at once (local: default one per GPU, else one per CPU core; slurm: the array's %%K)")
    p.add_argument("--eval-separately", action="store_true",
                   help="train without inline evaluation, then evaluate each run in its own job")
    p.add_argument("--gpus", metavar="0,1,...", help="local: GPU indices to use, as this process counts them (default every visible GPU)")
    p.add_argument("--time", type=float, metavar="HOURS", dest="time_hours",
                   help="slurm: time limit per job (default 24); local: a time slice per job (default none); a job "
                        "that reaches it is requeued and continues from state.pt")
    p.add_argument("--partition", help="slurm partition")
    p.add_argument("--gpus-per-job", type=int, default=None,
                   help="slurm: GPUs per job (default: 0 when train.device is cpu, 1 when cuda; for auto, 1 unless "
                        "the partition has no GPUs in sinfo; 0 when --slurm-option asks for gres or gpus)")
    p.add_argument("--cpus-per-job", type=int, help="slurm: CPUs per job")
    p.add_argument("--mem-gb", type=float, help="slurm: memory per job in GB")
    p.add_argument("--account", help="slurm account")
    p.add_argument("--qos", help="slurm quality of service")
    p.add_argument("--constraint", help="slurm node constraint")
    p.add_argument("--signal-delay-s", type=int, default=300,
                   help="seconds between the USR2 signal and the time limit (default 300: an inline evaluation may "
                        "have to finish before the state is saved)")
    p.add_argument("--max-requeues", type=int, default=20,
                   help="time-limit requeues per job before giving up (default 20; preemptions do not count)")
    p.add_argument("--setup", action="append", default=[], metavar="SHELL_LINE",
                   help="slurm: a line run before the job, e.g. 'module load cuda' (repeatable)")
    p.add_argument("--slurm-option", action="append", default=[], metavar="KEY=VALUE",
                   help="slurm: an extra '#SBATCH --KEY=VALUE' line (repeatable)")
    p.add_argument("--wait", action="store_true",
                   help="slurm: after submitting, follow the jobs (scontrol, or sacct where there is one) until each "
                        "has ended, then report them; exit 1 if one failed or was cancelled")

    p = sub.add_parser("status", help=VERBS["status"], description=VERBS["status"])
    p.add_argument("experiment_dir", help="the --out folder of `diffmem sweep`")

    p = sub.add_parser("tensorboard", help=VERBS["tensorboard"], description=VERBS["tensorboard"] + "; then "
                       "watch them with `tensorboard --logdir EXPERIMENT_DIR` (needs the tensorboard package)")
    p.add_argument("experiment_dir", help="an experiment folder (or one run folder)")

    p = sub.add_parser("bench", help=VERBS["bench"], description=VERBS["bench"])
    bench = p.add_subparsers(dest="bench_verb", metavar="WHAT", required=True)
    for name, text in (("train", "training steps of diffmem's loop: images/s, FLOPs, utilisation"),
                       ("sample", "DDIM sampling: images/s"),
                       ("eval", "one full evaluation of the demo's model, its parts timed")):
        q = bench.add_parser(name, help=text, description=text)
        q.add_argument("--device", default="cpu", help="cpu | cuda | auto (default cpu)")
        q.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
        if name in ("train", "sample"):
            q.add_argument("--width", type=_positive_int, default=8, help="U-Net base width W (default 8)")
            q.add_argument("--image-size", type=_positive_int, default=16, help="image side (default 16)")
            q.add_argument("--attention", action="store_true", help="with the paper's attention layers")
    q = bench.choices["train"]
    q.add_argument("--batch", type=_positive_int, default=32, help="batch size (default 32)")
    q.add_argument("--steps", type=_positive_int, default=30, help="timed optimizer steps (default 30)")
    q.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    q.add_argument("--adam-impl", default="default", choices=["default", "foreach", "fused", "single"],
                   help="Adam implementation (default: what training builds)")
    q.add_argument("--channels-last", action="store_true", help="channels-last memory format (train.channels_last)")
    q.add_argument("--precision", default="fp32", choices=TRAIN_PRECISIONS,
                   help="bf16: autocast of the U-Net forward (train.precision; default fp32)")
    q.add_argument("--compile", action="store_true", help="torch.compile the training forward (train.compile)")
    q.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=TrainConfig.deterministic,
                   help="CUDA: deterministic algorithms (train.deterministic; default on)")
    q = bench.choices["sample"]
    q.add_argument("--n-samples", type=_positive_int, default=256, help="images sampled (default 256)")
    q.add_argument("--sampler-steps", type=_positive_int, default=50, help="DDIM steps (default 50)")
    q.add_argument("--batch-size", type=_positive_int, default=1000, help="samples per forward batch (default 1000)")
    q = bench.choices["eval"]
    q.add_argument("--n-samples", type=_positive_int, default=256, help="samples per evaluation (default 256)")
    q.add_argument("--sampler-steps", type=_positive_int, default=50, help="DDIM steps (default 50)")
    q.add_argument("--n", type=_positive_int, default=64, help="train-set size (default 64)")
    q.add_argument("--repeats", type=_positive_int, default=3, help="timed evaluations (default 3)")
    q.add_argument("--train-steps", type=_positive_int, default=200, help="training steps timed (default 200)")
    q.add_argument("--config", help="experiment file (default: experiments/demo.toml of this checkout)")

    p = sub.add_parser("theory", help=VERBS["theory"], description=VERBS["theory"])
    theory = p.add_subparsers(dest="theory_verb", metavar="WHAT", required=True)
    q = theory.add_parser("sweep", help="psi_n x seeds -> curves.csv, summary.csv, fits.json, spectrum.json, "
                          "figures/", description="Closed-form training curves of the random-features score "
                          "over psi_n and seeds, their timescales and power-law fits, U's spectrum, figures.")
    q.add_argument("--out", required=True, help="output folder (its files are rewritten)")
    q.add_argument("--config", help="TOML file with a [theory] section (default: the paper's numerics)")
    q.add_argument("--set", action="append", default=[], metavar="theory.KEY=VALUE",
                   help="override a key of [theory], e.g. --set theory.psi_n=[4,8] (repeatable)")
    q.add_argument("--compare", help="a U-Net experiment folder analysed by `diffmem analyze` (e.g. results/demo): "
                   "adds figures/theory_vs_unet")
    q.add_argument("--quick", action="store_true", help="a small sweep for a smoke test (d = 40, two psi_n, "
                   "one seed, no real-feature spectrum)")
    p = sub.add_parser("coverage", help=VERBS["coverage"], description=VERBS["coverage"])
    p.add_argument("--n-sim", type=_positive_int, default=1000,
                   help="simulated experiments per setting (default 1000; the tables in docs/analysis.md)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulations (default 0)")
    p.add_argument("--grid-ratio", type=float, default=1.2,
                   help="ratio of consecutive evaluation steps of the independent and shared grids (default 1.2)")
    p.add_argument("--refine-ratio", type=float, default=1.1,
                   help="the refined settings' eval.refine_ratio: brackets narrowed to this factor (default 1.1)")
    p.add_argument("--grids", default=",".join(GRID_NAMES),
                   help="comma-separated evaluation grids to study: " + ", ".join(GRID_NAMES) + " (default: all)")
    p.add_argument("--study", choices=("laws", "joint", "levels", "all"), default="all",
                   help="which table: the laws of one variable, the joint law of N and W, the level-crossing laws, "
                   "or all three (default)")
    p.add_argument("--jobs", type=_positive_int, default=1, help="processes that simulate settings (default 1)")
    return parser


def _load(args) -> tuple:
    from diffmem.config import load_config

    overrides = list(args.overrides)
    if getattr(args, "fid_weights", None):
        overrides.append(f"eval.fid_weights={_toml_str(args.fid_weights)}")
    return load_config(args.config, overrides)


def _toml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def cmd_prepare(args) -> int:
    from diffmem.data import prepare_celeba

    out = prepare_celeba(args.root, size=args.size, out=args.out, skip_bad=args.skip_bad)
    print(out)
    return 0


def cmd_train(args) -> int:
    from diffmem.outcomes import DONE, INTERRUPTED, SKIPPED
    from diffmem.train import train

    cfg, _ = _load(args)
    result = train(cfg, args.out, progress=not args.no_progress)
    return 0 if result.status in (DONE, SKIPPED, INTERRUPTED) else 1


def cmd_evaluate(args) -> int:
    from diffmem.evaluate import evaluate_run

    evaluate_run(args.run_dir, device=args.device, fid_weights=args.fid_weights, kept=args.kept,
                 refine_n_samples=args.refine_n_samples)
    return 0


def cmd_pairs(args) -> int:
    from diffmem.paired_evaluation import evaluate_pairs

    evaluate_pairs(args.experiment_dir, device=args.device, n_samples=args.n_samples,
                   refine=not args.no_refine)
    return 0


def cmd_analyze(args) -> int:
    from diffmem.split_pairs import unevaluated_pairs_note
    from diffmem.results import write_results

    summary = write_results(args.experiment_dir, figures=not args.no_figures, out_dir=args.out,
                            n_samples=args.n_samples, pdf=not args.no_pdf)
    print(summary.format())
    note = unevaluated_pairs_note(args.experiment_dir)
    if note:
        print(note)
    return 0


def cmd_advise(args) -> int:
    from diffmem.analysis.advise import advise

    print(advise(args.n, args.width, args.source).format())
    return 0


def cmd_demo(args) -> int:
    from diffmem.demo import run_demo
    from diffmem.rundir import require_folder

    if args.config is None:
        args.config = demo_config_path()
        if not args.config.is_file():
            raise FileNotFoundError(f"{args.config} not found (diffmem was not installed from a checkout); "
                                    "pass --config experiments/demo.toml")
    require_folder(args.out)
    cfg, sweep = _load(args)
    return run_demo(cfg, sweep, args.out, quick=args.quick, jobs=args.jobs, progress=not args.no_progress)


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"{flag} expects comma-separated integers like 0,1,2, got '{text}'") from None


def _key_values(items: list[str], flag: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} expects KEY=VALUE, got '{item}' (e.g. {flag} gres=gpu:a100:1)")
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


def cmd_sweep(args) -> int:
    from diffmem.cluster.base import ClusterOptions
    from diffmem.split_pairs import sweep_pairs_hint
    from diffmem.rundir import require_folder
    from diffmem.sweep import run_sweep

    cfg, sweep = _load(args)
    out = Path(args.out) if args.out else Path("runs") / Path(args.config).stem
    require_folder(out)
    options = ClusterOptions(
        cluster=args.cluster, max_parallel=args.max_parallel,
        gpus=_int_list(args.gpus, "--gpus") if args.gpus else None, time_hours=args.time_hours,
        partition=args.partition, gpus_per_job=args.gpus_per_job, cpus_per_job=args.cpus_per_job,
        mem_gb=args.mem_gb, account=args.account, qos=args.qos, constraint=args.constraint,
        signal_delay_s=args.signal_delay_s, max_requeues=args.max_requeues, setup=tuple(args.setup),
        slurm_options=_key_values(args.slurm_option, "--slurm-option"))
    report = run_sweep(cfg, sweep, out, options, eval_separately=args.eval_separately, dry_run=args.dry_run,
                       progress=not args.no_progress, wait=args.wait)
    print(report.format())
    hint = sweep_pairs_hint(sweep.splits, out)
    if hint:
        print(hint)
    return 1 if report.failed or report.cancelled else 0


def cmd_status(args) -> int:
    from diffmem.cluster.runstate import experiment_status
    from diffmem.status import format_status

    print(format_status(experiment_status(args.experiment_dir), args.experiment_dir))
    return 0


def cmd_tensorboard(args) -> int:
    from diffmem.tensorboard.live import INSTALL_HINT, available

    if not available():
        raise RuntimeError(f"the tensorboard package is not installed: {INSTALL_HINT.split('; ')[0]}")
    from diffmem.tensorboard.rebuild import write_tensorboard

    print(write_tensorboard(args.experiment_dir).format())
    return 0


def cmd_bench(args) -> int:
    import json

    from diffmem.throughput import bench_eval, bench_sample, bench_train

    common = dict(device=args.device, threads=args.threads, log=print)
    if args.bench_verb == "train":
        out = bench_train(args.width, args.image_size, args.batch, args.steps, attention=args.attention,
                          warmup=args.warmup, adam_impl=args.adam_impl, channels_last=args.channels_last,
                          precision=args.precision, compile=args.compile, deterministic=args.deterministic,
                          **common)
    elif args.bench_verb == "sample":
        out = bench_sample(args.width, args.image_size, args.n_samples, args.sampler_steps, attention=args.attention,
                           batch_size=args.batch_size, **common)
    else:
        out = bench_eval(args.n_samples, args.sampler_steps, args.n, args.repeats, args.train_steps,
                         config_path=args.config, **common)
    print(json.dumps(out))
    return 0


QUICK_THEORY = ("theory.d=40", "theory.psi_p=16", "theory.psi_n=[2,4]", "theory.seeds=[0]", "theory.n_tau=121",
                "theory.test_draws=500", "theory.spectrum_psi_n=2", "theory.spectrum_noise_draws=0")
"""`diffmem theory sweep --quick`: overrides applied before the user's --set."""


def cmd_theory(args) -> int:
    from diffmem.config import load_theory_config
    from diffmem.rundir import require_folder
    from diffmem.theory.psi_sweep import run_theory_sweep

    overrides = (list(QUICK_THEORY) if args.quick else []) + list(args.set)
    require_folder(args.out)
    cfg = load_theory_config(args.config, overrides)
    if args.compare is not None and not (Path(args.compare) / "summary.csv").is_file():
        raise FileNotFoundError(f"{args.compare}/summary.csv not found; run `diffmem analyze {args.compare}` first")
    summary = run_theory_sweep(cfg, args.out, compare=args.compare, log=print)
    print(summary.format())
    return 0


def cmd_coverage(args) -> int:
    from diffmem.analysis import coverage

    if args.seed < 0:
        raise ValueError(f"--seed {args.seed} must be an integer >= 0 (numpy seeds are non-negative), e.g. --seed 0")
    for flag, value in (("--grid-ratio", args.grid_ratio), ("--refine-ratio", args.refine_ratio)):
        if not 1 < value < float("inf"):  # NaN fails this too
            raise ValueError(f"{flag} {value} must be a finite number > 1 (e.g. 1.2: evaluations 1.2x apart)")
    grids = [g.strip() for g in args.grids.split(",") if g.strip()]
    unknown = [g for g in grids if g not in coverage.GRIDS]
    if unknown or not grids:
        raise ValueError(f"--grids {args.grids!r}: each must be one of {', '.join(coverage.GRIDS)}")
    ratios = dict(grid_ratio=args.grid_ratio, refine_ratio=args.refine_ratio)
    print(f"{args.n_sim} simulated experiments per setting, seed {args.seed}, continuous grids {args.grid_ratio:g}x "
          f"apart, refined to {args.refine_ratio:g}x")
    if args.study in ("laws", "all"):
        results = coverage.run_all(coverage.settings(grids=grids, **ratios), coverage.run_setting, args.n_sim,
                                   args.seed, args.jobs)
        print("\nLaws of one variable (planted exponents 0, 0.5, 1):\n" + coverage.format_table(results))
        print(coverage.coverage_summary(results))
        print("Against the targets:\n" + coverage.law_target_checks(results))
        print(coverage.format_around(coverage.around_wide_rows(results, coverage.run_setting, args.n_sim,
                                                               args.seed, args.jobs)))
    if args.study in ("joint", "all"):
        joint = coverage.run_all(coverage.joint_settings(grids=grids, **ratios), coverage.run_joint_setting,
                                 args.n_sim, args.seed, args.jobs)
        print("\nThe joint law tau ~ N^a W^b:\n" + coverage.format_joint_table(joint))
        print("Against the targets:\n" + coverage.joint_target_checks(joint))
        print(coverage.format_around(coverage.around_wide_rows(joint, coverage.run_joint_setting, args.n_sim,
                                                               args.seed, args.jobs)))
    if args.study in ("levels", "all"):
        levels = coverage.run_all(coverage.level_settings(grids=grids, **ratios), coverage.run_level_setting,
                                  args.n_sim, args.seed, args.jobs)
        print(f"\nLevel crossings (tau_mem_at_{coverage.LEVEL:g} from planted f_mem curves, exponent 1):\n"
              + coverage.format_level_table(levels))
        print(coverage.coverage_summary(levels))
        print("Against the targets:\n" + coverage.law_target_checks(levels))
        print(coverage.format_around(coverage.around_wide_rows(levels, coverage.run_level_setting, args.n_sim,
                                                               args.seed, args.jobs)))
    return 0


COMMANDS = {"prepare": cmd_prepare, "train": cmd_train, "evaluate": cmd_evaluate, "pairs": cmd_pairs,
            "analyze": cmd_analyze,
            "advise": cmd_advise, "demo": cmd_demo, "sweep": cmd_sweep, "status": cmd_status, "bench": cmd_bench,
            "tensorboard": cmd_tensorboard,
            "theory": cmd_theory, "coverage": cmd_coverage}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.debug:
        warnings.showwarning = _one_line_warning
    start = time.perf_counter()
    try:
        return COMMANDS[args.verb](args)
    except KeyboardInterrupt:
        print("diffmem: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, RuntimeError) as e:  # user errors become one line; --debug for the traceback
        if args.debug:
            raise
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"diffmem {args.verb}: error: {message}", file=sys.stderr)
        return 2
    except MemoryError:  # sizes beyond this machine (a huge width, sample count or image size)
        if args.debug:
            raise
        print(f"diffmem {args.verb}: error: out of memory; lower the sizes of the config (model.width, "
              "data.image_size, eval.n_samples, eval.batch_size)", file=sys.stderr)
        return 2
    finally:
        if args.debug:
            print(f"[{args.verb} took {time.perf_counter() - start:.1f} s]", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
