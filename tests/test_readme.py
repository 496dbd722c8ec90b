"""The README stays true: its examples run as shown, its commands' options exist, its links resolve.

Rule for the README's code blocks: every ```` ```bash ```` and ```` ```python ```` block runs, in order,
in one work folder that holds the bundled ``examples/`` (as from the root of a clone), unless the line
before it is an ``<!-- not run by tests/test_readme.py: REASON -->`` comment (installing packages,
the Quickstart, which runs this suite). Blocks that do not run are still checked: Python compiles, and
every ``pack-dataset`` / ``dataset-bench`` command line in README.md and docs/*.md parses with the
real argument parsers. Every relative link in README.md and docs/*.md names an existing file (and,
for a Markdown file, an existing heading).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
SKIP = re.compile(r"<!-- not run by tests/test_readme\.py: .+ -->")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    runs: bool


def code_blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, with whether the README rule runs them."""
    lines, out, k = text.splitlines(), [], 0
    while k < len(lines):
        m = FENCE.match(lines[k])
        if not m:
            k += 1
            continue
        end = next((j for j in range(k + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"line {k + 1}: a code block that never closes")
        before = next((lines[j] for j in range(k - 1, -1, -1) if lines[j].strip()), "")
        lang = m.group(1)
        out.append(Block(lang, "\n".join(lines[k + 1:end]) + "\n", k + 1,
                         lang in ("bash", "python") and not SKIP.fullmatch(before.strip())))
        k = end + 1
    return out


def section(text: str, title: str) -> str:
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def command_lines(code: str, prompted_only: bool = False) -> list[list[str]]:
    """The ``pack-dataset`` and ``dataset-bench`` invocations of a shell block, as argv lists
    (``prompted_only``: only the lines after a ``$`` prompt, as in a block of a command and its output)."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        line = line.strip()
        if prompted_only and not line.startswith("$ "):
            continue
        line = line.removeprefix("$ ")
        if line.split(" ", 1)[0] in ("pack-dataset", "dataset-bench"):
            out.append(shlex.split(line, comments=True))
    return out


# --------------------------------------------------------------------------- the shape


def test_block_rule_reads_marks_and_languages():
    text = ("x\n```bash\necho 1\n```\n<!-- not run by tests/test_readme.py: installs -->\n```bash\npip x\n```\n"
            "```text\nout\n```\n```python\nprint(1)\n```\n")
    blocks = code_blocks(text)
    assert [(b.lang, b.runs, b.line) for b in blocks] == [("bash", True, 2), ("bash", False, 6), ("text", False, 9),
                                                         ("python", True, 12)]
    assert command_lines("pack-dataset a -f wds -o 'b c'  # note\nls\n$ dataset-bench --quick\n") == [
        ["pack-dataset", "a", "-f", "wds", "-o", "b c"], ["dataset-bench", "--quick"]]


def test_readme_is_short_and_its_quickstart_is_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 300
    quick = section(text, "Quickstart")
    [commands] = [b for b in code_blocks(quick) if b.lang == "bash"]
    assert [line.split("#")[0].strip() for line in commands.code.splitlines()] == ["./scripts/demo.sh",
                                                                                  "./scripts/test.sh"]
    for script in ("demo.sh", "test.sh"):
        assert os.access(REPO / "scripts" / script, os.X_OK), script
    [printed] = [b for b in code_blocks(quick) if b.lang == "text"]  # what demo.sh printed: 4 packs, 4 reads
    for fmt in ("wds", "lmdb", "hdf5", "mmap"):
        assert f"-> out/demo/{fmt}\n" in printed.code and f"out/demo/{fmt}: 31 samples checked, OK" in printed.code
        assert re.search(rf"^read {fmt:5s}: 31 samples in ", printed.code, re.M), fmt
    for title in ("Install", "Packing", "Reading", "Training", "Features"):
        assert f"\n## {title}\n" in text, title


#: What varies from run to run in the demo's lines: seconds and rates.
_TIMINGS = re.compile(r"\d+\.\d+ s\b|\(\d+ img/s\)")


@pytest.mark.slow
def test_the_quickstart_shows_what_the_demo_prints(tmp_path):
    """``scripts/demo.sh`` (without its set-up: this environment) prints the README's Quickstart lines, but
    for the timings: the pack summaries, the verify lines, and each read's batch shape, labels and classes."""
    out = tmp_path / "demo"
    env = dict(os.environ, DATASET_PACKER_DEMO_SETUP="0",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run(["bash", str(REPO / "scripts" / "demo.sh"), str(REPO / "examples" / "real-images"), str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    [printed] = [b for b in code_blocks(section(README.read_text(encoding="utf-8"), "Quickstart")) if b.lang == "text"]
    got = [_TIMINGS.sub("T", line.replace(str(out), "out/demo")) for line in done.stdout.splitlines()]
    assert got == [_TIMINGS.sub("T", line) for line in printed.code.splitlines()]


def test_readme_and_docs_python_blocks_compile():
    for path in (README, *DOCS):
        for b in code_blocks(path.read_text(encoding="utf-8")):
            if b.lang == "python":
                compile(b.code, f"{path.name}:{b.line}", "exec")


def test_readme_and_docs_commands_parse_with_the_real_parsers():
    """Every ``pack-dataset`` / ``dataset-bench`` line shown is accepted by the parser the command uses."""
    from dataset_bench.cli import build_parser as bench_parser
    from packer.cli import COMMANDS, build_main_parser, build_parser

    checked = 0
    for path in (README, *DOCS):
        for b in code_blocks(path.read_text(encoding="utf-8")):
            if b.lang not in ("bash", "sh", "console", ""):
                continue
            for argv in command_lines(b.code, prompted_only=not b.lang):  # unlabelled: synopses and output
                if argv[0] == "dataset-bench":
                    parser = bench_parser()
                else:
                    parser = build_main_parser() if argv[1:2] and argv[1] in COMMANDS else build_parser()
                try:
                    parser.parse_args(argv[1:])
                except SystemExit:
                    pytest.fail(f"{path.name}:{b.line}: {shlex.join(argv)} is refused by {argv[0]}'s parser")
                checked += 1
    assert checked >= 20


# --------------------------------------------------------------------------- the links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text, seen, out = path.read_text(encoding="utf-8"), {}, set()
    inside = False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside and (m := re.match(r"#{1,6} (.+)", line)):
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)  # not inside code blocks
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]


def test_slug_and_links():
    assert slug("Measuring: `dataset-bench`, the starvation meter, notebooks") == \
        "measuring-dataset-bench-the-starvation-meter-notebooks"
    assert slug("Bad input, rejects and `--strict`") == "bad-input-rejects-and---strict"


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_relative_links_resolve(path):
    links = relative_links(path)
    for link in links:
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        assert file.exists(), f"{path.name}: link {link!r}: {file} does not exist"
        if anchor and file.suffix == ".md":
            assert anchor in anchors(file), f"{path.name}: link {link!r}: no heading #{anchor} in {file.name}"
    if path == README:
        docs = {(README.parent / link.partition("#")[0]).resolve() for link in links}
        assert {d.resolve() for d in DOCS} - docs == set(), "a doc the README does not link"


# --------------------------------------------------------------------------- the examples run


def run_block(block: Block, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    cmd = ["bash", "-euo", "pipefail", "-c", block.code] if block.lang == "bash" else [sys.executable, "-c",
                                                                                       block.code]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"README.md:{block.line} ({block.lang}) exit {r.returncode}:\n{r.stdout[-2000:]}" \
                              f"\n{r.stderr[-3000:]}"
    return r


@pytest.mark.slow
def test_readme_examples_run_as_shown(tmp_path):
    """Packing, reading and training, top to bottom, on the bundled photos; the training block twice (resume)."""
    work = tmp_path / "clone"
    work.mkdir()
    (work / "examples").symlink_to(REPO / "examples")
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # this venv's pack-dataset
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    text = README.read_text(encoding="utf-8")
    runs = [b for b in code_blocks(text) if b.runs]
    titles = {"Packing": [], "Reading": [], "Training": []}
    for title, found in titles.items():
        found += [b for b in code_blocks(section(text, title)) if b.runs]
        assert found, f"the README's {title} section has no example that runs"
    printed = {b.code: run_block(b, work, env).stdout for b in runs}
    packing = "".join(printed[b.code] for b in titles["Packing"])
    assert "state        complete" in packing and re.search(r"samples\s+31\n", packing)
    assert "31 samples checked, OK" in packing
    for fmt in ("wds", "lmdb", "mmap", "hdf5", "lmdb-512"):
        assert (work / "out" / f"photos-{fmt}" / "index.json").is_file(), fmt
    [reading] = titles["Reading"]
    assert re.search(r"^\(\d, 3, 224, 224\) torch\.uint8 \[", printed[reading.code], re.M)
    [training] = titles["Training"]
    assert re.findall(r"^epoch (\d+): loss", printed[training.code], re.M) == ["0", "1"]
    again = run_block(training, work, env).stdout  # resumes from out/last.pt: the epochs after the saved ones
    assert re.findall(r"^epoch (\d+): loss", again, re.M) == ["2", "3"]
