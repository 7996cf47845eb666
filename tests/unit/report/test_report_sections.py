"""The run report on hand-made records: each section's content, its "no data" line, escaping, determinism."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reprorl.cli.main import main
from reprorl.evaluation.judge import write_scores
from reprorl.evaluation.labels import Label, append_label
from reprorl.hashing import content_hash
from reprorl.report import build_report, render_report
from reprorl.report.page import CHARTS_META, plotly_js
from reprorl.report.series import final_train_rows, health_keys, reward_band, success_band, tool_series
from reprorl.report.trajectories import pick
from reprorl.store import RunRecord, Store
from reprorl.store.rollouts import RolloutWriter
from reprorl.types import Reward, Split, Termination, ToolCall, ToolOutcome, ToolResult, Trajectory, Turn
from rollout_records import KINDS, judge_score, make

HOSTILE = "<script>alert('pwned')</script>"
SUITE = "calc-eval"


def _run(store: Store, name: str = "hand-made") -> RunRecord:
    spec = {"name": name, "seed": 3, "budget": {"prices": {"cpu_usd_per_hour": 0.36}}}
    return RunRecord.create(store, spec=spec, spec_hash=content_hash(spec), name=name, seeds={"root": 3})


def _hostile(run_id: str) -> Trajectory:
    """A failed rollout whose model text, tool call and tool output all try to inject markup."""
    result = ToolResult(
        call_id="c1", name="calc", outcome=ToolOutcome.TOOL_EXCEPTION, content=HOSTILE, error=f"bad {HOSTILE}"
    )
    turn = Turn(
        index=0,
        text=f"I will run {HOSTILE} now",
        tool_calls=(ToolCall(id="c1", name="calc", arguments={"expr": HOSTILE}),),
        tool_results=(result,),
        finish_reason="tool_call",
    )
    return make(1, "answered", run_id).model_copy(
        update={
            "rollout_id": f"{run_id}/hostile",
            "split": Split.TRAIN,
            "turns": (turn,),
            "reward": Reward(total=-1.0, components={"outcome": 0.0}, verifier_version="sha256:v"),
            "termination": Termination.MAX_TURNS,
        }
    )


def _train_line(step: int) -> dict[str, float]:
    return {
        "reward_mean": 0.5,
        "success": 0.25,
        "train/entropy": 2.0 - 0.1 * step,
        "train/kl_k3": 0.01 * step,
        "train/clip_frac_high": 0.02,
        "train/clip_frac_low": 0.01,
        "train/mismatch_k3": 1e-6,
        "train/grad_norm": 0.5,
        "zero_variance_share": 0.5,
        "response_tokens_mean": 20.0,
        "truncation_rate": 0.1,
        "unrelated_figure": 7.0,
        "tools/calc/ok": 3.0,
        "tools/calc/tool_timeout": 1.0,
        "tools/calc/failure_rate": 0.25,
        "tools/sql/ok": float(step),
        "tools/sql/failure_rate": 0.0,
        "tools/failure_rate": 0.2,
        "rollout_s": 2.0,
        "train_s": 1.0,
        "rollout_cpu_s": 1.5,
        "train_cpu_s": 0.9,
        "cost_usd": 0.001,
        "family/calculator/success": 0.25 * step,
        "family/sql/success": 0.5,
        "exploration/calculator/calc": 4.0,
        "exploration/sql/sql_query": 0.0,
    }


def _eval_line(step: int) -> dict[str, float]:
    k = f"eval/{SUITE}"
    return {
        f"{k}/success": 0.5,
        f"{k}/success_low": 0.2,
        f"{k}/success_high": 0.8,
        f"{k}/partial_credit": 0.6,
        f"{k}/reward": 0.7,
        f"{k}/tasks": 8.0,
        f"{k}/rollouts": 8.0,
        f"{k}/cost_usd": 0.0005,
        "eval_s": 3.0,
        "eval_cpu_s": 2.0,
    }


@pytest.fixture
def full_run(store: Store) -> RunRecord:
    record = _run(store)
    writer = RolloutWriter(record)
    for step in (0, 1):
        batch = [make(step * 10 + j, KINDS[j % len(KINDS)], record.run_id) for j in range(6)]
        if step == 1:
            batch.append(_hostile(record.run_id))
        writer.write(step, batch)
    for step in (0, 2):
        record.log_metrics(
            step, _eval_line(step), stage="eval", suite=f"{SUITE}@sha256:abc", policy_version="p"
        )
    for step in (0, 1):
        record.log_metrics(step, _train_line(step), policy_version="p")
    fired = {
        "when": "metric_below",
        "action": "revert",
        "metric": "success",
        "threshold": 0.9,
        "step": 2,
        "evidence": {"success": 0.5, "note": HOSTILE},
        "message": "success 0.5 is below 0.9",
    }
    record.event("guard_check", step=0, passed=True, action=None, fired=[])
    record.event("guard_check", step=2, passed=False, action="revert", fired=[fired])
    record.event("reverted", step=2, to_step=0, rules=["metric_below"], policy_version="adapter:sha256:00")
    record.event("stopped_by_rule", step=2, rules=["metric_below"], action="stop")
    record.event(
        "oracle_tools", needed={"calculator": ["calc"], "sql": ["sql_query"]}, demonstrations=2, solved=2
    )
    record.event("tool_unexplored", step=1, family="sql", tool=HOSTILE, steps=[0, 1])
    record.set_status("succeeded")
    return record


def _outside_plotly(page: str) -> str:
    assert page.count(plotly_js()) == 1
    return page.replace(plotly_js(), "")


def test_two_renders_are_byte_identical(store: Store, full_run: RunRecord, tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = render_report(store, full_run.run_id, out / "a.html")
    second = render_report(store, full_run.run_id[:20], out / "b.html")
    assert (out / "a.html").read_bytes() == (out / "b.html").read_bytes()
    assert first.bytes == second.bytes == (out / "a.html").stat().st_size
    assert sorted(p.name for p in out.iterdir()) == ["a.html", "b.html"]  # no temp file left


def test_every_section_has_its_content(store: Store, full_run: RunRecord) -> None:
    report = build_report(store, full_run)
    by_key = {s.key: s for s in report.sections}
    assert list(by_key) == [
        "header",
        "curves",
        "health",
        "pipeline",
        "tool-failures",
        "tool-usage",
        "exploration",
        "cost",
        "eval",
        "guards",
        "trajectories",
    ]
    assert [s.key for s in report.sections if not s.has_data] == ["pipeline"]  # a synchronous run
    charts = [c.div_id for s in report.sections for c in s.charts]
    assert charts == [
        "chart-reward",
        "chart-success",
        "chart-eval-success",
        "chart-health",
        "chart-tool-failures",
        "chart-tool-usage",
        "chart-family-success",
        "chart-needed-tools",
        "chart-cost",
    ]
    page = report.html
    assert f'<meta name="{CHARTS_META}" content="9">' in page
    for div in charts:
        assert page.count(f'id="{div}"') == 1
    assert "unrelated_figure" not in page  # health keys are picked by name, never everything
    eval_html = by_key["eval"].html()
    assert "0.500 [0.200, 0.800]" in eval_html
    assert "No human labels and no judge scores are stored for this run." in eval_html
    guards = by_key["guards"].html()
    assert "failed → revert" in guards and "reverted to the weights of step 0" in guards
    assert "success 0.5 is below 0.9" in guards and "stopped (stop)" in guards
    trajectories = by_key["trajectories"].html()
    # The four most frequent failed terminations are shown; the rarer one is named.
    for termination in ("infra_error", "invalid_action", "max_tokens", "tool_timeout"):
        assert f"failed: {termination}" in trajectories
    assert "Also failed, not shown here: max_turns (1)." in trajectories
    assert "best reward" in trajectories and "worst reward" in trajectories
    exploration = by_key["exploration"].html()
    assert "calculator: calc; sql: sql_query" in exploration and "0, 1" in exploration


def test_record_text_is_escaped(store: Store, full_run: RunRecord) -> None:
    report = build_report(store, full_run)
    page = _outside_plotly(report.html)
    assert HOSTILE not in page
    assert "<script>alert" not in page
    worst = {s.key: s for s in report.sections}["trajectories"].html().split("worst reward (-1)")[1]
    escaped = "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;"
    assert f"I will run {escaped} now" in worst  # the model's text
    assert f"call calc({{&quot;expr&quot;: &quot;{escaped}&quot;}})" in worst  # its tool call
    assert f"error: bad {escaped}" in worst  # the tool's error and output
    # The only scripts are plotly.js and one newPlot per chart.
    scripts = re.findall(r"<script[^>]*>", page)
    assert len(scripts) == 1 + 9


def test_no_network_reference_outside_plotly_js(store: Store, full_run: RunRecord) -> None:
    page = _outside_plotly(build_report(store, full_run).html)
    assert re.findall(r"(?:https?:)?//[\w.-]+\.\w", page) == []
    assert re.findall(r"\b(?:src|href)=\"(?!#|data:)", page) == []
    assert "default-src 'none'" in page and "connect-src 'none'" in page


def test_a_run_without_records_says_so_in_each_section(store: Store) -> None:
    record = _run(store, "empty")
    report = build_report(store, record)
    empty = {s.key: s for s in report.sections if not s.has_data}
    assert set(empty) == {
        "curves",
        "health",
        "pipeline",
        "tool-failures",
        "tool-usage",
        "exploration",
        "cost",
        "eval",
        "guards",
        "trajectories",
    }
    assert report.charts == 0
    lines = {key: re.findall(r'<p class="none">(.*?)</p>', s.html()) for key, s in empty.items()}
    assert lines["curves"] == [
        "No train steps were recorded (no train rollouts and no step metrics).",
        "No eval points were recorded.",
    ]
    assert lines["health"] == ["No health metrics were recorded for any train step."]
    assert lines["pipeline"] == [
        "The run was synchronous: every step trained on the batch it had just sampled."
    ]
    assert lines["tool-failures"] == ["No tool calls were recorded in any train step."]
    assert lines["cost"] == ["No timing or cost was recorded for any step."]
    assert lines["exploration"] == [
        "No per-family or per-tool figures were recorded (a run from before they were logged)."
    ]
    assert lines["guards"] == ["No guard events: no rollback rules were set."]
    assert lines["trajectories"] == ["No rollouts are stored for this run."]
    assert f'<meta name="{CHARTS_META}" content="0">' in report.html


def test_metric_lines_alone_still_give_curves(store: Store) -> None:
    record = _run(store, "metrics-only")
    record.log_metrics(0, {"reward_mean": 0.25, "success": 0.0})
    record.log_metrics(1, {"reward_mean": 0.75, "success": 0.5})
    curves = build_report(store, record).sections[1]
    assert [c.div_id for c in curves.charts] == ["chart-reward", "chart-success"]
    assert "the logged step means are shown without intervals" in curves.html()


def test_series_match_the_rollouts(store: Store, full_run: RunRecord) -> None:
    from reprorl.report.records import RunView

    view = RunView.load(store, full_run)
    assert view.rollouts is not None
    steps = final_train_rows(view.rollouts)
    reward = reward_band(steps)
    for step, mean in zip(reward.x, reward.y, strict=True):
        rows = steps[step]
        assert mean == pytest.approx(sum(r["reward_total"] or 0.0 for r in rows) / len(rows))
    success = success_band(steps)
    assert success.low is not None and success.high is not None
    assert all(lo <= v <= hi for lo, v, hi in zip(success.low, success.y, success.high, strict=True))  # type: ignore[operator]
    panels = dict(health_keys(view.train_lines()))
    assert panels["clip fractions"] == ["train/clip_frac_high", "train/clip_frac_low"]
    assert panels["KL to reference"] == ["train/kl_k3"]
    tools = tool_series(view.train_lines())
    assert tools.calls == {"calc": [4.0, 4.0], "sql": [0.0, 1.0]}
    assert tools.class_rate == {"tool_timeout": [0.25, 0.2]}


def test_pick_skips_retried_attempts_and_is_stable() -> None:
    rows = [
        {"rollout_id": "a", "reward_total": 1.0, "termination": "answered"},
        {"rollout_id": "b", "reward_total": 5.0, "termination": "infra_error", "retried": True},
        {"rollout_id": "c", "reward_total": 0.0, "termination": "tool_timeout"},
        {"rollout_id": "d", "reward_total": 0.0, "termination": "tool_timeout"},
    ]
    chosen = [(why, r["rollout_id"]) for why, r in pick(rows)]
    assert chosen == [("best reward (1)", "a"), ("worst reward (0); failed: tool_timeout", "c")]


def test_judge_against_human_labels(store: Store, full_run: RunRecord) -> None:
    ids = [f"{full_run.run_id}/r{i:04d}" for i in (0, 1, 2, 3)]
    for rollout_id, verdict in zip(ids, ("pass", "fail", "pass", "fail"), strict=True):
        append_label(
            full_run,
            Label(
                run_id=full_run.run_id,
                rollout_id=rollout_id,
                label=verdict,
                reviewer="ann",
                time="2025-01-01",
            ),
        )
    scores = [
        judge_score(full_run.run_id, rollout_id, value, judge="m@abc", n=i)
        for i, (rollout_id, value) in enumerate(zip(ids, (1.0, 0.0, 0.0, 0.0), strict=True))
    ]
    write_scores(full_run, scores)
    page = {s.key: s for s in build_report(store, full_run).sections}["eval"].html()
    assert "<code>m@abc</code>" in page
    assert "75.0%" in page  # 3 of 4 agree
    assert "0.500" in page  # kappa: (0.75 - 0.5) / (1 - 0.5)


def test_cli_writes_into_the_run_folder_and_prints_json(
    store: Store, full_run: RunRecord, capsys: pytest.CaptureFixture[str]
) -> None:
    home = ["--home", str(store.root)]
    assert main([*home, "runs", "report", full_run.run_id[:22], "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["path"] == str(full_run.path / "report.html")
    assert result["sections"][0]["key"] == "header"
    assert result["charts"] == 9 and Path(result["path"]).stat().st_size == result["bytes"]
    assert main([*home, "runs", "report", full_run.run_id]) == 0
    assert capsys.readouterr().out.splitlines()[0] == str(full_run.path / "report.html")
    assert main([*home, "runs", "report", "no-such-run"]) == 2
    assert capsys.readouterr().err.startswith("error: no run matches")


def test_a_damaged_rollout_part_is_named_not_fatal(store: Store, full_run: RunRecord) -> None:
    (part,) = sorted(full_run.path.glob("rollouts/step=000001/*.parquet"))
    part.chmod(0o644)
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    sections = {s.key: s for s in build_report(store, full_run).sections}
    assert "the logged step means are shown without intervals" in sections["curves"].html()
    assert [c.div_id for c in sections["curves"].charts] == [
        "chart-reward",
        "chart-success",
        "chart-eval-success",
    ]
    assert not sections["trajectories"].has_data
    assert "The rollout store cannot be read" in sections["trajectories"].html()
    assert sections["health"].has_data and sections["guards"].has_data


def test_an_arrival_run_shows_how_each_step_was_fed(store: Store) -> None:
    spec = {
        "name": "arrival",
        "seed": 3,
        "learning": {"pipeline": {"source": "arrival", "lockstep": "ready", "max_staleness": 2}},
    }
    record = RunRecord.create(
        store, spec=spec, spec_hash=content_hash(spec), name="arrival", seeds={"root": 3}
    )
    record.event("rollout_workers", backend="ray", workers=2)
    waits = [4.0, 0.5]
    for step, wait in enumerate(waits):
        timing = {"timing/wait_s": wait, "timing/trainer_busy": 0.25 + step / 2, "timing/queue_depth": 3.0}
        record.log_metrics(step, {**_train_line(step), **timing, "staleness_mean": 0.5, "staleness_max": 1.0})
    record.event(
        "batch_assembled",
        step=1,
        groups=[
            {"group": 0, "planned_step": 0, "version": 0, "restored": False},
            {"group": 5, "planned_step": 2, "version": 1, "restored": True},
        ],
    )
    section = {s.key: s for s in build_report(store, record).sections}["pipeline"]
    assert section.has_data
    page = section.html()
    assert "<dd>2 (ray)</dd>" in page and "<dd>arrival</dd>" in page
    rows = re.findall(r"<tr>(.*?)</tr>", page)[1:]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows]
    assert [c[:6] for c in cells] == [
        ["0", "0.50 / 1", "4.0", "1.0", "25%", "3"],
        ["1", "0.50 / 1", "0.5", "1.0", "75%", "3"],
    ]
    assert cells[0][6] == ""  # no assembly recorded for step 0
    assert cells[1][6] == "g0 (planned 0 behind, v0); g5 (planned 2 ahead, v1, read back)"
    assert "waited 4.5 s for batches and updated for 2.0 s over 2 steps" in page
