"""Every malformed run spec is refused by the CLI with one line naming the field, and writes nothing.

Each case runs `reprorl --home HOME spec resolve --save FILE [OVERRIDES...]` in-process: the
command would store the resolved spec on success, so an error that slipped through validation
would show up as a store under HOME. The positive controls at the end prove that check can fail.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pytest

from reprorl.cli.main import main
from reprorl.store import Store

# A valid spec: every field below is accepted, so each case differs from it by one defect.
BASE = """\
name = "table-test"
seed = 7

[model]
owner = "model-team@example.com"
base = "base-model@v1"
init_adapter = "init-adapter@v1"
adapter = { kind = "lora", rank = 8, alpha = 16.0, dropout = 0.0, targets = ["q_proj", "v_proj"] }

[data]
owner = "data-team@example.com"
train = "train-set@v1"
tool_output_chars = 2048
noise = { timeout_p = 0.1 }

[learning]
owner = "rl-team@example.com"
loss = { kind = "ppo_clip", clip_low = 0.2, clip_high = 0.28 }
lr = 5e-5
steps = 10
group_size = 4
top_p = 1.0
kl = { estimator = "k3", coef = 0.01 }

[evaluation]
owner = "eval-team@example.com"
suites = ["suite-a@v1", "suite-b@v1"]
every_steps = 5
thresholds = { success = 0.5 }
rollback = [{ when = "metric_below", metric = "success", threshold = 0.5, action = "revert" }]
allow_leakage = false

[budget]
max_usd = 10.0
"""

# The artifacts BASE refers to, all as `NAME@v1`.
ARTIFACTS = (
    "base-model",
    "init-adapter",
    "train-set",
    "suite-a",
    "suite-b",
)

SPEC_FILE = "<spec file>"
"""Stands for the name of the case's spec file in an expectation (TOML syntax and file errors)."""

DIRECTORY = object()
"""A case source: the spec path is a directory."""

HEX64 = "0123456789abcdef" * 4


def edit(*changes: tuple[str, str]) -> str:
    """BASE with each `old` (which must occur exactly once) replaced by `new`."""
    text = BASE
    for old, new in changes:
        assert text.count(old) == 1, f"{old!r} must occur once in BASE"
        text = text.replace(old, new)
    return text


def without_section(name: str) -> str:
    text, count = re.subn(rf"^\[{name}\]\n(?:[^\[\n].*\n)*\n?", "", BASE, flags=re.MULTILINE)
    assert count == 1, name
    return text


def add_to(section: str, line: str) -> str:
    """BASE with `line` added as the first key of `[section]` (or of the top level if '')."""
    if not section:
        return line + "\n" + BASE
    return edit((f"[{section}]\n", f"[{section}]\n{line}\n"))


class Case(NamedTuple):
    id: str
    spec: str | bytes | object | None  # TOML text, raw bytes, DIRECTORY, or None: no file
    overrides: tuple[str, ...]
    expect: str  # must appear in the error line; SPEC_FILE stands for the file's name
    leads: bool = True  # the line reads `error: <expect>: ...` (the field comes first)
    problems: int = 1  # lines: one per problem, the expected one first


def case(
    id: str,
    spec: str | bytes | object | None,
    expect: str,
    *overrides: str,
    leads: bool = True,
    problems: int = 1,
) -> Case:
    return Case(id, spec, overrides, expect, leads, problems)


def ref_case(id: str, old: str, new: str, field: str) -> Case:
    """A reference in BASE (`"old"`, quoted) replaced by `new`."""
    return case(id, edit((f'"{old}"', f'"{new}"')), field)


MODEL_OWNER = 'owner = "model-team@example.com"\n'
DATA_OWNER = 'owner = "data-team@example.com"\n'
LEARNING_OWNER = 'owner = "rl-team@example.com"\n'
EVAL_OWNER = 'owner = "eval-team@example.com"\n'
ADAPTER = 'adapter = { kind = "lora", rank = 8, alpha = 16.0, dropout = 0.0, targets = ["q_proj", "v_proj"] }'
ROLLBACK = 'rollback = [{ when = "metric_below", metric = "success", threshold = 0.5, action = "revert" }]'

CASES: list[Case] = [
    # -- a missing owner, per section ----------------------------------------------------------
    case("model-owner-missing", edit((MODEL_OWNER, "")), "model.owner"),
    case("data-owner-missing", edit((DATA_OWNER, "")), "data.owner"),
    case("learning-owner-missing", edit((LEARNING_OWNER, "")), "learning.owner"),
    case("evaluation-owner-missing", edit((EVAL_OWNER, "")), "evaluation.owner"),
    case("data-owner-blank", edit((DATA_OWNER, 'owner = "   "\n')), "data.owner"),
    case("evaluation-owner-empty", edit((EVAL_OWNER, 'owner = ""\n')), "evaluation.owner"),
    case(
        "two-problems-first-named",
        edit((MODEL_OWNER, ""), ("lr = 5e-5", "lr = 5.0")),
        "model.owner",
        problems=2,
    ),
    # -- missing sections and top-level keys ---------------------------------------------------
    case("model-section-missing", without_section("model"), "model"),
    case("data-section-missing", without_section("data"), "data"),
    case("learning-section-missing", without_section("learning"), "learning"),
    case("evaluation-section-missing", without_section("evaluation"), "evaluation"),
    case("seed-missing", edit(("seed = 7\n", "")), "seed"),
    case("empty-file", "", "seed", problems=5),
    # -- unknown keys ---------------------------------------------------------------------------
    case("unknown-top-level-key", add_to("", "sed = 7"), "sed"),
    case("unknown-section", BASE + "\n[optimizer]\nname = 'adamw'\n", "optimizer"),
    case("unknown-model-key", add_to("model", 'revision = "abc"'), "model.revision"),
    case("unknown-data-key", add_to("data", 'train_set = "train-set@v1"'), "data.train_set"),
    case("unknown-learning-key", add_to("learning", "lrr = 1e-5"), "learning.lrr"),
    case("unknown-evaluation-key", add_to("evaluation", 'suite = ["suite-a@v1"]'), "evaluation.suite"),
    case("unknown-budget-key", add_to("budget", "max_dollars = 5.0"), "budget.max_dollars"),
    case("unknown-adapter-key", edit(("rank = 8", "rnk = 8")), "model.adapter.rnk"),
    case(
        "unknown-key-for-full-adapter",
        edit((ADAPTER, 'adapter = { kind = "full", rank = 8 }')),
        "model.adapter.rank",
    ),
    case("unknown-kl-key", edit(("coef = 0.01", "coeff = 0.01")), "learning.kl.coeff"),
    case(
        "unknown-rollback-key",
        edit(('action = "revert" }', 'action = "revert", severity = 1 }')),
        "evaluation.rollback[0].severity",
    ),
    # -- wrong types ----------------------------------------------------------------------------
    case("seed-string", edit(("seed = 7", 'seed = "7"')), "seed"),
    case("seed-float", edit(("seed = 7", "seed = 1.5")), "seed"),
    case("seed-date", edit(("seed = 7", "seed = 1979-05-27")), "seed"),
    case("steps-string", edit(("steps = 10", 'steps = "10"')), "learning.steps"),
    case("steps-whole-float", edit(("steps = 10", "steps = 10.0")), "learning.steps"),
    case("lr-bool", edit(("lr = 5e-5", "lr = true")), "learning.lr"),
    case("owner-list", edit((LEARNING_OWNER, 'owner = ["rl-team"]\n')), "learning.owner"),
    case("ref-int", edit(('"suite-b@v1"', "3")), "evaluation.suites[1]"),
    case("suites-string", edit(('["suite-a@v1", "suite-b@v1"]', '"suite-a@v1"')), "evaluation.suites"),
    case("bool-string", edit(("allow_leakage = false", 'allow_leakage = "no"')), "evaluation.allow_leakage"),
    case("adapter-rank-string", edit(("rank = 8", 'rank = "8"')), "model.adapter.rank"),
    case("kl-scalar", edit(('kl = { estimator = "k3", coef = 0.01 }', "kl = 0.01")), "learning.kl"),
    case("noise-string", edit(("timeout_p = 0.1", 'timeout_p = "high"')), "data.noise.timeout_p"),
    case("budget-array-of-tables", edit(("[budget]", "[[budget]]")), "budget"),
    # -- constraints: ranges, choices, lengths --------------------------------------------------
    case("seed-negative", edit(("seed = 7", "seed = -1")), "seed"),
    case("seed-too-large", edit(("seed = 7", f"seed = {2**63}")), "seed"),
    case("lr-zero", edit(("lr = 5e-5", "lr = 0.0")), "learning.lr"),
    case("lr-negative", edit(("lr = 5e-5", "lr = -1e-5")), "learning.lr"),
    case(
        "arrival-without-lag",
        add_to("learning", 'pipeline = { source = "arrival" }'),
        "learning.pipeline: source = 'arrival' with max_staleness = 0 trains exactly the groups 'planned'",
        leads=False,
    ),
    case(
        "source-unknown", add_to("learning", 'pipeline = { source = "fastest" }'), "learning.pipeline.source"
    ),
    case("flat-pipeline-field", add_to("learning", 'mode = "async"'), "learning.mode"),
    case("steps-negative", edit(("steps = 10", "steps = -3")), "learning.steps"),
    case("group-size-one", edit(("group_size = 4", "group_size = 1")), "learning.group_size"),
    case("top-p-above-one", edit(("top_p = 1.0", "top_p = 1.5")), "learning.top_p"),
    case("clip-low-one", edit(("clip_low = 0.2", "clip_low = 1.0")), "learning.loss.clip_low"),
    case(
        "tool-output-chars-zero",
        edit(("tool_output_chars = 2048", "tool_output_chars = 0")),
        "data.tool_output_chars",
    ),
    case("every-steps-zero", edit(("every_steps = 5", "every_steps = 0")), "evaluation.every_steps"),
    case("adapter-rank-zero", edit(("rank = 8", "rank = 0")), "model.adapter.rank"),
    case("adapter-dropout-one", edit(("dropout = 0.0", "dropout = 1.0")), "model.adapter.dropout"),
    case(
        "adapter-no-targets",
        edit(('targets = ["q_proj", "v_proj"]', "targets = []")),
        "model.adapter.targets",
    ),
    case("budget-negative", edit(("max_usd = 10.0", "max_usd = -1.0")), "budget.max_usd"),
    case("run-name-empty", edit(('name = "table-test"', 'name = ""')), "name"),
    case("unknown-loss", edit(('kind = "ppo_clip"', 'kind = "ppo"')), "learning.loss"),
    case(
        "loss-field-of-another",
        edit(('kind = "ppo_clip"', 'kind = "reinforce"')),
        "learning.loss.clip_low",
        problems=2,
    ),
    case(
        "loss-not-a-table",
        edit(('loss = { kind = "ppo_clip", clip_low = 0.2, clip_high = 0.28 }', "loss = 3")),
        "learning.loss",
    ),
    case("unknown-kl-estimator", edit(('estimator = "k3"', 'estimator = "k4"')), "learning.kl.estimator"),
    case(
        "unknown-rollback-when",
        edit(('when = "metric_below"', 'when = "bogus"')),
        "evaluation.rollback[0].when",
    ),
    case("empty-suites", edit(('["suite-a@v1", "suite-b@v1"]', "[]")), "evaluation.suites"),
    case("kl-coef-without-estimator", edit(('estimator = "k3"', 'estimator = "off"')), "learning.kl"),
    case("metric-below-without-metric", edit(('metric = "success", ', "")), "evaluation.rollback[0]"),
    case("metric-below-without-threshold", edit(("threshold = 0.5, ", "")), "evaluation.rollback[0]"),
    case("adapter-kind-qlora", edit((ADAPTER, 'adapter = { kind = "qlora" }')), "model.adapter"),
    case("adapter-kind-empty", edit(('kind = "lora", ', 'kind = "", ')), "model.adapter"),
    # -- NaN and infinity -----------------------------------------------------------------------
    case("lr-nan", edit(("lr = 5e-5", "lr = nan")), "learning.lr"),
    case("clip-high-inf", edit(("clip_high = 0.28", "clip_high = inf")), "learning.loss.clip_high"),
    case("noise-minus-inf", edit(("timeout_p = 0.1", "timeout_p = -inf")), "data.noise.timeout_p"),
    case("threshold-nan", edit(("success = 0.5 }", "success = nan }")), "evaluation.thresholds.success"),
    case(
        "rollback-threshold-inf",
        edit(("threshold = 0.5,", "threshold = inf,")),
        "evaluation.rollback[0].threshold",
    ),
    # -- floating labels and missing versions ---------------------------------------------------
    ref_case("base-latest", "base-model@v1", "base-model@latest", "model.base"),
    ref_case("base-latest-uppercase", "base-model@v1", "base-model@LATEST", "model.base"),
    ref_case("train-production", "train-set@v1", "train-set@production", "data.train"),
    ref_case("suite-main", "suite-b@v1", "suite-b@main", "evaluation.suites[1]"),
    ref_case("suite-head", "suite-a@v1", "suite-a@head", "evaluation.suites[0]"),
    ref_case("init-adapter-current", "init-adapter@v1", "init-adapter@current", "model.init_adapter"),
    ref_case("suite-stable", "suite-a@v1", "suite-a@stable", "evaluation.suites[0]"),
    ref_case("suite-dev", "suite-b@v1", "suite-b@dev", "evaluation.suites[1]"),
    ref_case("train-empty-version", "train-set@v1", "train-set@", "data.train"),
    ref_case("init-adapter-empty-version", "init-adapter@v1", "init-adapter@", "model.init_adapter"),
    ref_case("base-bare-name", "base-model@v1", "base-model", "model.base"),
    ref_case("suite-bare-name", "suite-b@v1", "suite-b", "evaluation.suites[1]"),
    ref_case("first-suite-bare-name", "suite-a@v1", "suite-a", "evaluation.suites[0]"),
    # -- versions that are neither vN nor a hash ------------------------------------------------
    ref_case("version-dotted", "base-model@v1", "base-model@1.2", "model.base"),
    ref_case("version-word", "train-set@v1", "train-set@abc", "data.train"),
    ref_case("version-short-hex", "suite-a@v1", "suite-a@abc12", "evaluation.suites[0]"),
    ref_case("version-short-sha256", "base-model@v1", "base-model@sha256:abc12", "model.base"),
    ref_case("version-v0", "suite-b@v1", "suite-b@v0", "evaluation.suites[1]"),
    ref_case("version-uppercase-hex", "init-adapter@v1", "init-adapter@ABCDEF0123", "model.init_adapter"),
    ref_case("bare-hash-too-short", "base-model@v1", "sha256:" + HEX64[:63], "model.base"),
    # -- artifact names -------------------------------------------------------------------------
    ref_case("artifact-name-leading-dash", "base-model@v1", "-base-model@v1", "model.base"),
    ref_case("artifact-name-with-space", "train-set@v1", "train set@v1", "data.train"),
    ref_case("artifact-name-empty", "suite-b@v1", "@v1", "evaluation.suites[1]"),
    ref_case("artifact-name-with-colon", "suite-a@v1", "suite:a@v1", "evaluation.suites[0]"),
    ref_case("artifact-name-with-at", "base-model@v1", "base@model@v1", "model.base"),
    ref_case("artifact-name-too-long", "base-model@v1", "m" * 129 + "@v1", "model.base"),
    # -- overrides ------------------------------------------------------------------------------
    case("override-without-equals", BASE, "'learning.lr'", "learning.lr", leads=False),
    case("override-empty-key", BASE, "'=3'", "=3", leads=False),
    case("override-empty-part", BASE, "'learning..lr=1'", "learning..lr=1", leads=False),
    case("override-spaced-part", BASE, "'learning. lr=1'", "learning. lr=1", leads=False),
    case("override-into-value", BASE, "seed", "seed.x=1"),
    case("override-into-list", BASE, "evaluation.suites", "evaluation.suites.1=x"),
    case("override-unknown-key", BASE, "learning.lrr", "learning.lrr=1"),
    case("override-bad-toml", BASE, "learning.lr", "learning.lr=[1,"),
    case("override-bad-toml-string", BASE, "model.base", 'model.base="base-model@v1'),
    case("override-wrong-type", BASE, "learning.steps", "learning.steps=ten"),
    case("override-nan", BASE, "learning.lr", "learning.lr=nan"),
    case("override-section-scalar", BASE, "learning", "learning=3"),
    case("override-floating-label", BASE, "model.base", "model.base=base-model@latest"),
    case("override-floating-list-item", BASE, "evaluation.suites[0]", 'evaluation.suites=["suite-a@main"]'),
    case(
        "removed-data-envs",
        edit(('train = "train-set@v1"', 'train = "train-set@v1"\nenvs = ["calc-env@v1"]')),
        "data.envs",
    ),
    case("override-adapter-key", BASE, "model.adapter.rnk", "model.adapter.rnk=4"),
    case("override-kl-off", BASE, "learning.kl", "learning.kl.estimator=off"),
    case("override-last-one-bad", BASE, "learning.top_p", "seed=3", "learning.top_p=2"),
    # -- unreadable files -----------------------------------------------------------------------
    case("toml-unclosed-string", edit(('"rl-team@example.com"', '"rl-team@example.com')), SPEC_FILE),
    case("toml-duplicate-key", edit(("lr = 5e-5", "lr = 5e-5\nlr = 1e-5")), SPEC_FILE),
    case("toml-bad-table-header", edit(("[learning]", "[learning")), SPEC_FILE),
    case("toml-duplicate-table", BASE + "\n[data]\nowner = 'x'\n", SPEC_FILE),
    case("toml-bad-value", edit(("lr = 5e-5", "lr = 5e-5x")), SPEC_FILE),
    case("toml-nul-byte", BASE.encode() + b"\x00", SPEC_FILE),
    case("not-utf8", BASE.replace("table-test", "t\u00e5ble").encode("latin-1"), SPEC_FILE, leads=False),
    case("file-missing", None, SPEC_FILE, leads=False),
    case("file-is-directory", DIRECTORY, SPEC_FILE, leads=False),
]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def assert_nothing_written(tmp_path: Path, home: Path, spec_path: Path) -> None:
    assert not home.exists(), f"the store was created: {sorted(p.name for p in home.rglob('*'))}"
    expected = {spec_path} if spec_path.exists() else set()
    assert set(tmp_path.iterdir()) == expected


@pytest.fixture(autouse=True)
def _no_store_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REPRORL_HOME", raising=False)
    monkeypatch.delenv("REPRORL_DB_URL", raising=False)


def test_cases_are_many_and_distinct() -> None:
    assert len(CASES) >= 55
    assert len({c.id for c in CASES}) == len(CASES)
    assert len({(str(c.spec), c.overrides) for c in CASES}) == len(CASES)


def test_base_spec_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without this, a case could fail for a defect of BASE rather than its own."""
    path = tmp_path / "base.toml"
    path.write_text(BASE, encoding="utf-8")
    code, out, err = run_cli(["--home", str(tmp_path / "home"), "spec", "validate", str(path)], capsys)
    assert (code, err) == (0, "")
    assert "5 references" in out
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_malformed_spec_is_refused_with_one_line(
    c: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_path = tmp_path / f"{c.id}.toml"
    if isinstance(c.spec, str):
        spec_path.write_text(c.spec, encoding="utf-8")
    elif isinstance(c.spec, bytes):
        spec_path.write_bytes(c.spec)
    elif c.spec is DIRECTORY:
        spec_path.mkdir()
    home = tmp_path / "home"

    code, out, err = run_cli(
        ["--home", str(home), "spec", "resolve", "--save", str(spec_path), *c.overrides], capsys
    )

    assert code == 2, err
    assert out == ""
    # One line per problem, the first the one the case plants; each names its field.
    lines = err.splitlines()
    assert lines and err.endswith("\n"), err
    assert len(lines) == c.problems, lines
    for other in lines:
        assert other.startswith("error: ") and other[len("error: ") :].strip(), other
    line = lines[0]
    expect = spec_path.name if c.expect == SPEC_FILE else c.expect
    assert expect in line
    if c.leads:
        assert line.startswith(f"error: {expect}: "), line
    assert "internal error" not in line  # bad input, not a bug
    assert "cannot be resolved" not in line  # refused for its defect, not for a missing store
    assert_nothing_written(tmp_path, home, spec_path)


# -- positive controls: the same command, given a valid spec, does write ------------------------


def test_valid_named_spec_is_resolved_and_saved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    payloads = tmp_path / "payloads"
    payloads.mkdir()
    hashes = {}
    for name in ARTIFACTS:
        payload = payloads / f"{name}.bin"
        payload.write_bytes(f"contents of {name}\n".encode())
        code, _, err = run_cli(["--home", str(home), "artifacts", "add", name, str(payload)], capsys)
        assert (code, err) == (0, "")
        hashes[name] = Store(home).resolve(f"{name}@v1").hash
    spec_path = tmp_path / "good.toml"
    spec_path.write_text(BASE, encoding="utf-8")
    before = {p for p in home.rglob("*") if p.is_file()}

    code, out, err = run_cli(["--home", str(home), "spec", "resolve", "--save", str(spec_path)], capsys)

    assert (code, err) == (0, ""), err
    digest = out.split("spec hash: ", 1)[1].split()[0]
    assert "model.base" in out and f"base-model@{hashes['base-model']}" in out
    assert {p for p in home.rglob("*") if p.is_file()} != before  # the spec's blob was added
    store = Store(home)
    saved = store.registry.newest("spec/table-test")
    assert saved.meta["spec_hash"] == digest
    assert {parent for parent, relation, _ in store.registry.parents(saved.hash)} == set(hashes.values())
    store.close()


def test_valid_hash_pinned_spec_creates_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bare `sha256:` references need no registry: the save is the only thing that writes."""
    text = re.sub(r'"[a-z-]+@v1"', f'"sha256:{HEX64}"', BASE)
    assert "@v1" not in text
    spec_path = tmp_path / "pinned.toml"
    spec_path.write_text(text, encoding="utf-8")
    home = tmp_path / "home"

    code, out, err = run_cli(["--home", str(home), "spec", "resolve", "--save", str(spec_path)], capsys)

    assert (code, err) == (0, ""), err
    assert "spec hash: sha256:" in out
    with pytest.raises(AssertionError):
        assert_nothing_written(tmp_path, home, spec_path)
    store = Store(home)
    saved = store.registry.newest("spec/table-test")
    assert saved.meta["spec_hash"] == out.split("spec hash: ", 1)[1].split()[0]
    assert [parent for parent, _, _ in store.registry.parents(saved.hash)] == [f"sha256:{HEX64}"]
    store.close()
