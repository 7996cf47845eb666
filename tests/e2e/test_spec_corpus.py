"""A malformed-spec corpus: specs and overrides that nest too deep, hold huge numbers or texts, name
nobody as owner, cap a budget at 0, write a broken hash, pile up problems, or measure a run on its
own train set. Each ends in exit 2, one line per problem naming its field and the fix, no
traceback, and nothing written."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
from cli_support import Cli, run_ids, tiny_spec, tiny_training_store

BASE = (Path(__file__).resolve().parents[2] / "configs" / "calculator.toml").read_text()
ZW = "\u200b"


def swap(old: str, new: str, count: int = -1, text: str = BASE) -> str:
    """The shipped spec with one text replaced; fails loudly if the spec no longer holds that text,
    so a changed spec cannot turn a malformed case into a valid one."""
    assert old in text, f"configs/calculator.toml no longer holds {old!r}: update this corpus"
    return text.replace(old, new, count)


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


def inline(depth: int) -> str:
    return "{ a = " * depth + "1" + " }" * depth


# (case id, spec text or None for the shipped calculator spec, overrides, field the first line names)
CASES: list[tuple[str, str | None, list[str], str]] = [
    # Depth.
    ("override array 13 deep", None, [f"learning.x={nested(13)}"], "learning.x"),
    ("override array 3000 deep", None, [f"learning.x={nested(3000)}"], "learning.x"),
    ("override inline tables 3000 deep", None, [f"learning.x={inline(3000)}"], "learning.x"),
    ("file array 3000 deep", BASE + f"\n[extra]\nx = {nested(3000)}\n", [], "spec.toml"),
    ("file inline tables 3000 deep", BASE + f"\n[extra]\nx = {inline(3000)}\n", [], "spec.toml"),
    ("file array 13 deep", BASE + f"\n[extra]\nx = {nested(13)}\n", [], "extra.x"),
    ("file table headers 14 deep", BASE + "\n[" + ".".join(["t"] * 14) + "]\nx = 1\n", [], "t.t"),
    ("override key 14 deep", None, [".".join(["learning"] * 14) + "=1"], "learning.learning"),
    # Integers and numbers.
    ("file seed of 5001 digits", swap("seed = 0", "seed = 1" + "0" * 5000), [], "spec.toml"),
    ("override seed of 5001 digits", None, ["seed=1" + "0" * 5000], "seed"),
    ("override negative 5001 digits", None, ["learning.steps=-1" + "0" * 5000], "learning.steps"),
    ("seed of 65 bits", None, [f"seed={2**64}"], "seed"),
    ("steps of 100 bits", None, [f"learning.steps={10**30}"], "learning.steps"),
    ("nested huge int", None, [f"evaluation.x=[1, [{2**70}]]"], "evaluation.x[1][0]"),
    ("file float 1e400", swap("lr = 1e-4", "lr = 1e400"), [], "learning.lr"),
    ("file nan", swap("lr = 1e-4", "lr = nan"), [], "learning.lr"),
    ("override -inf", None, ["learning.lr=-inf"], "learning.lr"),
    # Texts and lists.
    ("name of 70,000 characters", None, ["name=" + json.dumps("n" * 70_000)], "name"),
    (
        "file name of 70,000 characters",
        swap('name = "calc"', f'name = "{"n" * 70_000}"'),
        [],
        "name",
    ),
    ("20,000 suites", None, ["evaluation.suites=" + json.dumps(["calc-eval"] * 20_000)], "evaluation.suites"),
    ("name of 200 characters", None, ["name=" + "n" * 200], "name"),
    # Owners.
    ("empty owner", None, ['model.owner=""'], "model.owner"),
    ("blank owner", None, ['model.owner=" "'], "model.owner"),
    ("zero-width space owner", None, [f'model.owner="{ZW}"'], "model.owner"),
    ("invisible owner", None, ['data.owner="\\u200b\\u200c\\u200d\\ufeff"'], "data.owner"),
    ("tab and newline owner", None, ['learning.owner="\\t\\n"'], "learning.owner"),
    ("owner of 300 characters", None, ["evaluation.owner=" + "o" * 300], "evaluation.owner"),
    (
        "file zero-width owner",
        swap('owner = "you@example.com"', f'owner = "{ZW}"', 1),
        [],
        "model.owner",
    ),
    # Budget caps.
    ("max_usd 0", None, ["budget.max_usd=0"], "budget.max_usd"),
    ("max_usd 0.0", None, ["budget.max_usd=0.0"], "budget.max_usd"),
    ("max_wall_s 0", None, ["budget.max_wall_s=0"], "budget.max_wall_s"),
    ("max_tokens 0", None, ["budget.max_tokens=0"], "budget.max_tokens"),
    ("max_usd -1", None, ["budget.max_usd=-1"], "budget.max_usd"),
    # Broken hashes.
    ("short hash", None, ["data.train=sha256:abcd"], "data.train"),
    ("63 hex digits", None, ["data.train=sha256:" + "a" * 63], "data.train"),
    ("upper-case hash", None, ["data.train=sha256:" + "A" * 64], "data.train"),
    ("empty hash", None, ["data.train=sha256:"], "data.train"),
    ("short hash in a list", None, ['evaluation.suites=["sha256:abc"]'], "evaluation.suites[0]"),
    ("base model short hash", None, ["model.base=sha256:xyz"], "model.base"),
    ("name with a newline", None, ['data.train="calc-train\\n@v1"'], "data.train"),
    ("floating label", None, ["data.train=calc-train@latest"], "data.train"),
    # Other malformed input.
    ("override without =", None, ["learning.lr"], "override"),
    ("override with an empty key part", None, ["learning..lr=1"], "override"),
    ("override into a value", None, ["seed.x=1"], "seed"),
    ("unknown section", BASE + "\n[extras]\nx = 1\n", [], "extras"),
    ("lr as text", None, ['learning.lr="fast"'], "learning.lr"),
    ("negative steps", None, ["learning.steps=-2"], "learning.steps"),
    ("negative seed", None, ["seed=-1"], "seed"),
    ("not UTF-8", 'name = "\xff"\n', [], "spec.toml"),
    ("not TOML", "name = = 1\n", [], "spec.toml"),
    ("larger than 1 MiB", BASE + "#" * (1 << 20), [], "spec"),
]


@pytest.mark.parametrize(("text", "overrides", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_malformed_spec_is_one_line_naming_the_field(
    cli: Cli, tmp_path: Path, text: str | None, overrides: list[str], field: str
) -> None:
    spec = tmp_path / "spec.toml"
    if text is None:
        spec.write_text(BASE)
    else:
        spec.write_bytes(
            text.encode("utf-8", "surrogateescape") if "\xff" not in text else text.encode("latin-1")
        )
    code, out, err = cli("spec", "validate", str(spec), *overrides)
    assert code == 2, (out, err[:300])
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines[:3]
    assert lines[0].startswith(f"error: {field}") or lines[0].startswith(f"error: spec file {str(spec)!r}"), (
        lines[0][:200]
    )
    assert "Traceback" not in err and "internal error" not in err
    assert len(lines[0]) < 600  # the line says what is wrong; it does not echo a huge value back
    assert not cli.home.exists()


def test_every_problem_of_a_spec_is_named_on_a_line_of_its_own(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "five.toml"
    text = swap("seed = 0", "seedx = 0")
    text = swap("lr = 1e-4", 'lr = "fast"', 1, text)
    text = swap("steps = 10", "steps = -1", 1, text)
    text = swap('owner = "you@example.com"', f'owner = "{ZW}"', 1, text)
    spec.write_text(text + "\n[budget]\nmax_usd = 0\n")
    code, _, err = cli("spec", "validate", str(spec))
    assert code == 2
    lines = err.strip().splitlines()
    fields = sorted(line.removeprefix("error: ").split(":", 1)[0] for line in lines)
    assert fields == ["budget.max_usd", "learning.lr", "learning.steps", "model.owner", "seed", "seedx"], (
        lines
    )
    assert all(line.startswith("error: ") and len(line.split(": ", 2)) == 3 for line in lines), lines


@pytest.fixture(scope="module")
def store_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("corpus")
    store = tiny_training_store(tmp)
    with resources.as_file(resources.files("reprorl") / "examples" / "calc-train.jsonl") as path:
        lines = path.read_text().splitlines()[:5]
    (tmp / "train-only.jsonl").write_text("\n".join(lines) + "\n")
    store.add("train-only", tmp / "train-only.jsonl", kind="taskset")
    store.close()
    return tmp / "home"


@pytest.mark.parametrize(
    ("suites", "needle"),
    [
        (["calc-train"], "is the train task set"),
        (["calc-eval", "calc-train"], "is the train task set"),
        (["train-only"], "has no eval or holdout tasks"),
    ],
    ids=["the train set", "the train set second", "a set of train tasks only"],
)
def test_a_suite_that_cannot_measure_held_out_tasks_is_refused_before_anything_is_written(
    store_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], suites: list[str], needle: str
) -> None:
    cli = Cli(store_home, capsys)
    spec = tmp_path / "spec.toml"
    spec.write_text(tiny_spec("corpus", 0, evaluation={"suites": suites}))
    before = run_ids(store_home)
    line = cli.error("run", str(spec))
    index = suites.index("calc-train") if "calc-train" in suites else 0
    assert line.startswith(f"error: evaluation.suites[{index}]: ") and needle in line, line
    assert run_ids(store_home) == before


NO_TORCH = """
import sys
from reprorl.cli.main import main
code = main(sys.argv[1:])
print(code, "torch" in sys.modules)
"""


def test_refusing_a_spec_loads_no_torch(store_home: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "bad.toml"
    bad.write_text(swap("lr = 1e-4", 'lr = "fast"'))
    leaking = tmp_path / "leaking.toml"
    leaking.write_text(tiny_spec("corpus", 0, evaluation={"suites": ["calc-train"]}))
    for args in (
        ["spec", "validate", str(bad)],
        ["spec", "validate", str(Path(__file__).resolve().parents[2] / "configs" / "calculator.toml")],
        ["--home", str(store_home), "run", str(bad)],
        ["--home", str(store_home), "run", str(leaking)],
    ):
        done = subprocess.run(
            [sys.executable, "-c", NO_TORCH, *args], capture_output=True, text=True, timeout=120, check=False
        )
        code, torch_loaded = done.stdout.splitlines()[-1].split()
        assert torch_loaded == "False", (args, done.stderr[-300:])
        assert code == ("0" if args[1] == "validate" and "calculator" in args[-1] else "2"), (
            args,
            done.stderr,
        )
