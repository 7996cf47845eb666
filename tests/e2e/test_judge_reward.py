"""A judge as a training reward: refused until an audit lets it through or an override is recorded;
then every scored rollout carries the judge's score as a weighted component, and replays reuse it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import Cli, run_ids, tiny_training_store

from judge_server import Prompt, app, serve, verdict
from reprorl.config.judge import DEFAULT_RUBRIC, JudgeConfig, judge_id
from reprorl.evaluation.judge import final_answer
from reprorl.orchestrate.run.judge_gate import OVERRIDE_EVENT, ROBUST_EVENT
from reprorl.store import RunRecord, Store
from reprorl.store.rollout_query import RolloutStore
from reprorl.types import Termination

pytestmark = pytest.mark.slow

SPEC = """
name = "tiny-judged"
seed = 3
[model]
owner = "t@x"
base = "tiny"
adapter = {{ kind = "lora", rank = 4, alpha = 8.0, targets = ["q_proj", "v_proj"] }}
[data]
owner = "t@x"
train = "calc-train"
reward_weights = {{ outcome = 1.0, judge = 0.5 }}
[data.judge]
base_url = "{url}"
model = "{model}"
retries = 0
prompt_usd_per_mtok = 2.0
completion_usd_per_mtok = 10.0
{override}
[learning]
owner = "t@x"
pipeline = {{ max_staleness = {staleness} }}
steps = 2
lr = 1e-3
group_size = 3
tasks_per_step = 2
max_tokens = 12
max_turns = 2
drop_zero_variance_groups = false
[evaluation]
owner = "t@x"
suites = ["calc-eval"]
every_steps = 2
"""


def expected(answer: str) -> float:
    """A judge that is easy to check and easy to fool: the score follows the answer's length alone."""
    return (len(answer) % 3) / 2


class Counted:
    """The judge server's grading, counting the requests that reach it."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, prompt: Prompt) -> str:
        with self._lock:
            self.calls += 1
        return verdict(expected(prompt.answer), "length")


@pytest.fixture(scope="module")
def judge_server() -> Iterator[tuple[str, Counted]]:
    grade = Counted()
    with serve(app(grade)) as url:
        yield url, grade


def write_spec(
    path: Path, url: str, *, override: str = "", staleness: int = 0, model: str = "length"
) -> Path:
    line = f'override = "{override}"' if override else ""
    path.write_text(SPEC.format(url=url, model=model, override=line, staleness=staleness))
    return path


def audit_judge(cli: Cli, tmp_path: Path, url: str, model: str, *flags: str) -> tuple[int, str, str]:
    """Runs the judge robustness audit on the calculator family for the server's judge named `model`."""
    judge_file = tmp_path / "judge.toml"
    judge_file.write_text(f'base_url = "{url}"\nmodel = "{model}"\nretries = 0\n')
    return cli("rewards", "audit", "calculator", "--tasks", "2", "--judge", str(judge_file), *flags)


def check_judged(store: Store, run_id: str, judge: str) -> int:
    """Every scored rollout's reward holds the judge's score and the weighted total; returns how many."""
    judged = 0
    for trajectory in RolloutStore(RunRecord(store, run_id)).trajectories():
        reward = trajectory.reward
        if trajectory.retried or reward is None:
            assert trajectory.retried or trajectory.termination is Termination.INFRA_ERROR or trajectory.error
            continue
        score = reward.components["judge"]
        assert score == expected(final_answer(trajectory)), trajectory.rollout_id
        assert reward.total == pytest.approx(reward.components["outcome"] + 0.5 * score)
        assert reward.verifier_version.endswith(f"+judge:{judge}")
        # 100 prompt and 10 completion tokens a judgement at $2 and $10 per million: $0.0003 each.
        assert trajectory.cost_usd >= 0.0003 - 1e-12
        judged += 1
    return judged


def test_a_judge_trains_only_once_audited_or_overridden(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], judge_server: tuple[str, Counted]
) -> None:
    url, grade = judge_server
    store = tiny_training_store(tmp_path)
    home = tmp_path / "home"
    cli = Cli(home, capsys)
    spec = write_spec(tmp_path / "spec.toml", url)
    name = judge_id(JudgeConfig(base_url=url, model="length", rubric=DEFAULT_RUBRIC))

    # Never audited: refused before anything is written.
    line = cli.error("run", str(spec))
    assert f"judge {name} has no robustness audit" in line and "data.judge.override" in line
    assert run_ids(home) == [] and grade.calls == 0

    # Audited and refused (its score follows the length of any answer, so probes earn it).
    code, out, err = audit_judge(cli, tmp_path, url, "length")
    assert code == 1 and f"REFUSED {name}" in " ".join(out.split()), (out, err)
    line = cli.error("run", str(spec))
    assert f"judge {name} was refused by its audit judge-audit@v1" in line
    assert run_ids(home) == []

    # Overridden with a reason: the run trains on the judge and says why.
    reason = "scores checked against the length rule by this test"
    calls = grade.calls
    code, out, err = cli("run", str(write_spec(spec, url, override=reason)))
    assert code == 0, err
    (run_id,) = run_ids(home)
    record = RunRecord(store, run_id)
    assert record.status()["status"] == "succeeded"
    (event,) = [e for e in record.events().records if e["event"] == OVERRIDE_EVENT]
    assert event["reason"] == reason and event["judge"] == name and event["audit"] == "judge-audit@v1"
    judged = check_judged(store, run_id, name)
    # 2 steps x 2 tasks x 3 members, and the eval points; each judged once (the cache is per request).
    assert judged >= 12 and grade.calls - calls >= 12
    steps = [m for m in record.metrics().records if m.get("stage") is None]
    assert all(m["cost_usd"] >= 6 * 0.0003 - 1e-9 for m in steps)
    _, out, _ = cli("runs", "audit", run_id)
    assert f"data.judge {name} was used on an override (judge-audit@v1, fooled rate" in " ".join(out.split())

    # A replay judges the replayed rollout from the cache: the same reward, no request sent.
    rollout = next(
        t.rollout_id for t in RolloutStore(record).trajectories() if t.reward is not None and not t.retried
    )
    calls = grade.calls
    report = cli.ok_json("replay", rollout, "--mode", "live")
    assert report["identical"], report
    assert grade.calls == calls


def test_an_audited_judge_trains_in_the_async_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], judge_server: tuple[str, Counted]
) -> None:
    url, _ = judge_server
    store = tiny_training_store(tmp_path)
    home = tmp_path / "home"
    cli = Cli(home, capsys)
    # A threshold above its fooled rate lets the judge through: the gate reads the audit's verdict.
    code, out, err = audit_judge(cli, tmp_path, url, "length-async", "--judge-threshold", "0.99")
    assert code == 0 and "PASS length-async@" in " ".join(out.split()), (out, err)
    spec = write_spec(tmp_path / "spec.toml", url, staleness=1, model="length-async")
    code, out, err = cli("run", str(spec))
    assert code == 0, err
    (run_id,) = run_ids(home)
    record = RunRecord(store, run_id)
    name = judge_id(JudgeConfig(base_url=url, model="length-async"))
    (event,) = [e for e in record.events().records if e["event"] in (ROBUST_EVENT, OVERRIDE_EVENT)]
    assert event["event"] == ROBUST_EVENT and event["judge"] == name and event["audit"] == "judge-audit@v1"
    assert check_judged(store, run_id, name) >= 12
    _, out, _ = cli("runs", "audit", run_id)
    assert f"data.judge {name}: let through by its robustness audit (judge-audit@v1" in " ".join(out.split())


def test_a_judge_needs_a_weight(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny_training_store(tmp_path)
    cli = Cli(tmp_path / "home", capsys)
    spec = write_spec(tmp_path / "spec.toml", "http://127.0.0.1:9/v1")
    spec.write_text(spec.read_text().replace("judge = 0.5", "valid_calls = 1.0"))
    line = cli.error("run", str(spec))
    assert "data" in line and "reward_weights gives 'judge' no weight" in line
    assert run_ids(tmp_path / "home") == []
