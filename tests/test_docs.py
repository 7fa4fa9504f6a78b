"""The documentation held against the code: README.md and docs/*.md.

* every ``diffmem ...`` command in a shell code block parses with the real argument parser (it is never run);
* the config reference table of docs/commands.md lists exactly the fields of the config dataclasses;
* no documentation, experiment, benchmark, notebook or library file points outside the repository, and none of those
  nor the committed results names a folder of the machine a command ran on (a home or temp directory);
* every relative link resolves to a file of the repository (and, for ``page.md#anchor``, to a heading of that page).

Fast: no command is executed, nothing is trained or downloaded.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import subprocess
import shlex
from pathlib import Path

import pytest

from diffmem import config
from diffmem.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console", "zsh"}
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# --- markdown helpers -----------------------------------------------------------------------------------------------

def is_closing_fence(line: str, fence: str) -> bool:
    """A line that closes a block opened by ``fence``: at least as many fence characters and nothing else."""
    stripped = line.strip()
    return stripped.startswith(fence) and not stripped.strip(fence[0])


def code_blocks(text: str) -> list[tuple[int, str, list[str]]]:
    """Fenced code blocks of a markdown text: (line number of the first content line, language, lines)."""
    blocks, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, language = m.group(1), m.group(2).lower()
        body, j = [], i + 1
        while j < len(lines) and not is_closing_fence(lines[j], fence):
            body.append(lines[j])
            j += 1
        blocks.append((i + 2, language, body))
        i = j + 1
    return blocks


def prose(text: str) -> str:
    """The text without its fenced code blocks and inline code spans (links there are not links)."""
    out, inside, fence = [], False, ""
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and not inside:
            inside, fence = True, m.group(1)
            continue
        if inside:
            if is_closing_fence(line, fence):
                inside = False
            continue
        out.append(line)
    return re.sub(r"`[^`\n]*`", "", "\n".join(out))


def shell_commands(lines: list[str], first_line: int) -> list[tuple[int, str]]:
    """Commands of a shell block: continuation lines joined, a leading ``$ `` prompt stripped, comment lines dropped."""
    commands, current, start = [], "", first_line
    for k, raw in enumerate(lines):
        line = raw.rstrip()
        if not current:
            start = first_line + k
            stripped = line.lstrip()
            if stripped.startswith("$ "):
                line = stripped[2:]
            if not line.strip() or line.lstrip().startswith("#"):
                continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        commands.append((start, current + line))
        current = ""
    if current:
        commands.append((start, current))
    return commands


SEPARATORS = {"|", "||", "&&", "&", ";"}
WRAPPERS = {"nohup", "time", "exec"}


def strip_redirections(tokens: list[str]) -> list[str]:
    """Tokens without shell redirections (``> file``, ``>file``, ``2>&1``, ``&> file``)."""
    out, skip = [], False
    for token in tokens:
        if skip:
            skip = False
        elif re.fullmatch(r"\d*(>>?|<)|&>", token):  # the target is the next token
            skip = True
        elif not re.match(r"^(\d*(>>?|<)|&>)", token):
            out.append(token)
    return out


def diffmem_invocations(command: str) -> list[list[str]]:
    """The argument lists of the ``diffmem`` commands of one shell command line.

    The line is split at ``|``, ``&&``, ``;``, ``&``; each piece loses shell comments, redirections, variable
    assignments and the wrappers ``nohup``, ``time`` and ``watch [-n N]``. Raises ValueError on broken quoting.
    """
    pieces, piece = [], []
    for token in shlex.split(command, comments=True):
        if token in SEPARATORS:
            pieces.append(piece)
            piece = []
        else:
            piece.append(token)
    pieces.append(piece)
    found = []
    for tokens in pieces:
        tokens = strip_redirections(tokens)
        while tokens and (tokens[0] in WRAPPERS or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0])):
            tokens = tokens[1:]
        if tokens[:1] == ["watch"]:
            tokens = tokens[1:]
            while tokens and tokens[0].startswith("-"):
                tokens = tokens[2:] if tokens[0] in ("-n", "--interval") else tokens[1:]
        if tokens[:1] == ["diffmem"]:
            found.append(tokens[1:])
    return found


def documented_commands() -> list[tuple[str, str]]:
    found = []
    for path in DOC_FILES:
        for first_line, language, lines in code_blocks(path.read_text(encoding="utf-8")):
            if language not in SHELL_LANGUAGES:
                continue
            for line_no, command in shell_commands(lines, first_line):
                try:
                    is_diffmem = bool(diffmem_invocations(command))
                except ValueError:  # not shell syntax (say, a file listing); kept only if it names diffmem
                    is_diffmem = "diffmem" in command.split()
                if is_diffmem:
                    found.append((f"{rel(path)}:{line_no}", command))
    return found


COMMANDS = documented_commands()


# --- every documented command parses ----------------------------------------------------------------------------------

def test_docs_exist_and_hold_commands():
    names = {rel(p) for p in DOC_FILES}
    for page in ("commands", "data", "run-folder", "analysis", "cluster", "performance", "theory", "architecture",
                 "fidelity"):
        assert f"docs/{page}.md" in names
    assert len(COMMANDS) >= 20, f"only {len(COMMANDS)} diffmem commands found in the code blocks"
    verbs = set()
    for _, command in COMMANDS:
        with contextlib.suppress(ValueError):  # broken quoting is reported by test_documented_command_parses
            verbs |= {args[0] for args in diffmem_invocations(command) if args}
    missing = {"demo", "sweep", "train", "evaluate", "prepare", "analyze", "advise", "status", "bench", "theory"} - verbs
    assert not missing, f"no code-block example of: {sorted(missing)}"


@pytest.mark.parametrize("where, command", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_documented_command_parses(where, command):
    try:
        invocations = diffmem_invocations(command)
    except ValueError as e:
        pytest.fail(f"{where}: `{command.strip()}` is not valid shell syntax: {e}")
    assert invocations
    for args in invocations:
        parser = build_parser()
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                parser.parse_args(args)
            except SystemExit as e:  # --help / --version exit 0; a parse error exits 2
                assert e.code == 0, f"{where}: `{command.strip()}` does not parse: {err.getvalue().strip()}"


def test_code_block_helpers():
    text = ("x\n```bash\n$ diffmem demo --quick   # c\ndiffmem sweep a.toml \\\n    --cluster debug > log 2>&1 &\n"
            "pip install -e . && diffmem demo\n```\n```python\ndiffmem = 1\n```\n")
    blocks = code_blocks(text)
    assert [(line, lang) for line, lang, _ in blocks] == [(3, "bash"), (9, "python")]
    commands = shell_commands(blocks[0][2], blocks[0][0])
    assert [line for line, _ in commands] == [3, 4, 6]
    assert [diffmem_invocations(c) for _, c in commands] == [
        [["demo", "--quick"]], [["sweep", "a.toml", "--cluster", "debug"]], [["demo"]]]
    assert diffmem_invocations("nohup diffmem status runs/x") == [["status", "runs/x"]]
    assert diffmem_invocations("watch -n 60 diffmem status runs/x | tee log") == [["status", "runs/x"]]
    assert diffmem_invocations("python -m pytest -q") == []


def test_parse_check_bites():
    """A synopsis line (alternatives, optional brackets) is not a command: the parser rejects it."""
    parser = build_parser()
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit) as e:
        parser.parse_args(diffmem_invocations("diffmem sweep X.toml --cluster debug|local|slurm [--dry-run]")[0])
    assert e.value.code == 2


# --- the config reference lists every key -------------------------------------------------------------------------

def config_sections() -> dict[str, type]:
    """Every config section and its dataclass: the sections of RunConfig, plus [sweep] and [theory]."""
    sections = {f.name: type(f.default_factory()) for f in dataclasses.fields(config.RunConfig)}
    sections["sweep"] = config.SweepConfig
    sections["theory"] = config.TheoryConfig
    assert set(getattr(config, "ALL_SECTIONS", {})) <= set(sections)
    return sections


def test_config_reference_lists_every_key():
    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    start = text.index("## Config reference")
    end = text.find("\n## ", start + 1)
    table = text[start:end if end > 0 else len(text)]
    rows = re.findall(r"^\|\s*`([a-z_]+\.[a-z_0-9]+)`\s*\|", table, flags=re.MULTILINE)
    assert len(rows) == len(set(rows)), f"keys listed twice: {sorted({r for r in rows if rows.count(r) > 1})}"
    expected = {f"{name}.{f.name}" for name, cls in config_sections().items() for f in dataclasses.fields(cls)}
    documented = set(rows)
    assert not expected - documented, f"missing from docs/commands.md: {sorted(expected - documented)}"
    assert not documented - expected, f"not config keys: {sorted(documented - expected)}"


# --- nothing points outside the repository --------------------------------------------------------------------------

def repository_text_files() -> list[Path]:
    patterns = ["README.md", "docs/*.md", "experiments/**/*", "benchmarks/**/*", "diffmem/**/*.py", "notebooks/**/*"]
    files = set()
    for pattern in patterns:
        for path in ROOT.glob(pattern):
            if path.is_file() and "__pycache__" not in path.parts and ".ipynb_checkpoints" not in path.parts:
                files.add(path)
    return sorted(files)


TEXT_FILES = repository_text_files()


@pytest.mark.parametrize("path", TEXT_FILES, ids=[rel(p) for p in TEXT_FILES])
def test_no_path_outside_the_repository(path):
    text = path.read_text(encoding="utf-8", errors="replace")
    for needle in ("../shared", "/work/shared"):
        lines = [k + 1 for k, line in enumerate(text.splitlines()) if needle in line]
        assert not lines, f"{rel(path)} refers to {needle} on line(s) {lines}"


# --- no machine's own folders ---------------------------------------------------------------------------------------

MACHINE_PATH = re.compile(r"(?<![\w.~/-])(?:(?:/root|/home|/Users|/tmp|/var/tmp|/work)/|~[A-Za-z_][\w.-]*/)")
"""A folder of the machine a command ran on: a home (``/root/``, ``/home/...``, ``/Users/...``, another user's
``~name/``), a temp folder (``/tmp/``, ``/var/tmp/``) or this project's work folder (``/work/``), where it starts a
path (not ``runs/tmp/`` or a URL's ``.../tmp/``). The reader's own home, ``~/`` (``~/data/celeba32.pt``,
``~/.cache/diffmem``) or ``$HOME``, is a generic example and allowed."""

BINARY_SUFFIXES = {".png", ".pdf", ".pt", ".pth", ".npz", ".npy", ".jpg", ".jpeg", ".gif"}


def git_ignored(paths: list[Path]) -> set[Path]:
    """The paths among ``paths`` that the repository's .gitignore keeps out of it (none when git is missing or this
    is not a checkout): a run's job logs and weights in a development checkout are not shipped."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--stdin"], capture_output=True, text=True,
                             input="\n".join(str(p.relative_to(ROOT)) for p in paths), timeout=60)
    except (OSError, subprocess.SubprocessError):
        return set()
    return {ROOT / line for line in out.stdout.splitlines()} if out.returncode in (0, 1) else set()


def shipped_text_files() -> list[Path]:
    """The text files of what the repository ships to readers: the front page, docs, experiments, results,
    benchmarks, notebooks and the package, less what .gitignore keeps out."""
    patterns = ["README.md", "docs/**/*", "experiments/**/*", "results/**/*", "benchmarks/**/*", "notebooks/**/*",
                "diffmem/**/*.py"]
    found = sorted({path for pattern in patterns for path in ROOT.glob(pattern)
                    if path.is_file() and path.suffix.lower() not in BINARY_SUFFIXES
                    and "__pycache__" not in path.parts and ".ipynb_checkpoints" not in path.parts})
    ignored = git_ignored(found)
    return [path for path in found if path not in ignored]


def test_machine_path_rule():
    for bad in ("--out /root/diffmem-runs/x", "/home/alice/data", "cd /Users/bob/x", "--out /tmp/demo_quick",
                "TMP=/var/tmp/x", '"path": "/tmp/x"', "(/work/shared/tools)", "~alice/data", "--out=/tmp/x"):
        assert MACHINE_PATH.search(bad), bad
    for good in ("--set data.path=~/data/celeba32.pt", "~/.cache/diffmem", "$HOME/slurm1", "runs/tmp/x",
                 "https://example.org/home/x", "results/demo/report.md", "a ~ b/c", "./tmp/x"):
        assert not MACHINE_PATH.search(good), good


def test_no_machine_paths_in_what_the_repository_ships():
    found = []
    for path in shipped_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{rel(path)}:{k + 1}: {m.group(0)}" for k, line in enumerate(text.splitlines())
                  for m in MACHINE_PATH.finditer(line)]
    assert not found, "paths of the machine a command ran on (use a relative folder such as runs/x, or ~/ for the " \
                      "reader's home): " + "; ".join(found[:20])


# --- relative links resolve ---------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings (lower case, punctuation dropped, spaces -> hyphens)."""
    anchors, seen = set(), {}
    for line in prose(path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def documented_links() -> list[tuple[Path, str]]:
    links = []
    for path in DOC_FILES:
        for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.IGNORECASE):  # http:, https:, mailto:
                links.append((path, target))
    return links


LINKS = documented_links()


def test_docs_have_links():
    assert len(LINKS) >= 20


@pytest.mark.parametrize("path, target", LINKS, ids=[f"{rel(p)}->{t}" for p, t in LINKS])
def test_relative_link_resolves(path, target):
    file_part, _, anchor = target.partition("#")
    resolved = (path.parent / file_part).resolve() if file_part else path
    assert resolved.is_relative_to(ROOT), f"{rel(path)}: link {target} leaves the repository"
    assert resolved.exists(), f"{rel(path)}: link {target} points to a missing file"
    if anchor and resolved.suffix == ".md":
        assert anchor in heading_anchors(resolved), f"{rel(path)}: no heading #{anchor} in {rel(resolved)}"
