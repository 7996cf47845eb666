"""Human review labels: a person's pass/fail (or score) on a rollout, kept apart from judge scores.

Labels live in the run folder as `labels.jsonl`, one checksummed line per label, never mixed with
`judge_scores.jsonl`. A label made at the terminal is appended (durably, one line); an import is
all or nothing: every row is checked first, then the file is rewritten in one atomic rename. A
newer label by the same reviewer on the same rollout supersedes the older one; the older line
stays as history. `agreement` compares a judge with the humans on pass/fail.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from reprorl.errors import RecordError, UserInputError
from reprorl.store import RunRecord, read_log
from reprorl.store.atomic import append_durable, write_atomic

# The run-log line format (checksum + record), so `read_log` verifies these files like any run log.
from reprorl.store.runs import checksummed_line

if TYPE_CHECKING:
    from reprorl.evaluation.judge import JudgeScore

LABELS_FILE = "labels.jsonl"
PASS_THRESHOLD = 0.5
IMPORT_FIELDS = ("rollout_id", "label", "reviewer", "note", "time")
REQUIRED_FIELDS = ("rollout_id", "label")
LABEL_HELP = "pass, fail or a number from 0 to 1"


class Label(BaseModel):
    """One person's verdict on one rollout: pass/fail or a score in [0, 1], and who said it when."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    rollout_id: str = Field(min_length=1)
    label: Literal["pass", "fail"] | float = Field(description=f"{LABEL_HELP}.")
    reviewer: str = Field(min_length=1, description="Who reviewed; a name, not a role.")
    note: str = ""
    time: str = Field(description="When the label was given, ISO 8601 in UTC.")
    source: str = Field(default="review", description="'review' (terminal) or 'import:<file name>'.")

    @field_validator("label", mode="before")
    @classmethod
    def _label(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip().lower()
            if text in ("pass", "fail"):
                return text
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{value!r} is not {LABEL_HELP}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{value!r} is not {LABEL_HELP}")
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise ValueError(f"{value} is not {LABEL_HELP}")
        return float(value)

    @field_validator("reviewer", "rollout_id")
    @classmethod
    def _stripped(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("is empty")
        return value.strip()

    @field_validator("time")
    @classmethod
    def _time(cls, value: str) -> str:
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO 8601 time such as 2025-01-31T14:00:00Z") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)  # a reviewer's bare time is taken as UTC, and recorded so
        return moment.astimezone(UTC).isoformat()

    def passed(self, threshold: float = PASS_THRESHOLD) -> bool:
        """Pass/fail: a score passes at or above `threshold`."""
        return self.label == "pass" if isinstance(self.label, str) else self.label >= threshold


def now() -> str:
    return datetime.now(UTC).isoformat()


def labels_path(run: RunRecord) -> Path:
    return run.path / LABELS_FILE


def read_labels(run: RunRecord) -> list[Label]:
    """Every label line of the run, oldest first.

    A line cut short by a crash mid-append is not JSON and is skipped (as run logs do); a line
    that is whole JSON but fails its checksum was edited, and is an error.
    """
    path = labels_path(run)
    log = read_log(path)
    if log.bad_lines:
        lines = path.read_bytes().splitlines()
        for number in log.bad_lines:
            try:
                json.loads(lines[number - 1])
            except ValueError:
                continue
            raise RecordError(f"{path}: line {number} was edited (its checksum does not match)")
    try:
        return [Label.model_validate(record) for record in log.records]
    except ValidationError as exc:
        raise RecordError(f"{path}: a line is not a label: {exc.errors()[0]['msg']}") from None


def append_label(run: RunRecord, label: Label) -> Path:
    """Add one label durably; what was labelled before a crash or a quit stays."""
    _check_run(run, label)
    path = labels_path(run)
    append_durable(path, checksummed_line(label.model_dump(mode="json")))
    return path


def latest_labels(labels: Iterable[Label], reviewer: str | None = None) -> dict[str, Label]:
    """The newest label of each rollout (by `reviewer` only, when given); later lines win ties."""
    newest: dict[str, Label] = {}
    for label in labels:
        if reviewer is not None and label.reviewer != reviewer:
            continue
        old = newest.get(label.rollout_id)
        if old is None or datetime.fromisoformat(label.time) >= datetime.fromisoformat(old.time):
            newest[label.rollout_id] = label
    return newest


def reviewed_by(labels: Iterable[Label], reviewer: str) -> set[str]:
    return {label.rollout_id for label in labels if label.reviewer == reviewer}


def _check_run(run: RunRecord, label: Label) -> None:
    if label.run_id != run.run_id:
        raise RecordError(f"label of {label.rollout_id} belongs to run {label.run_id}, not {run.run_id}")


# -- import --------------------------------------------------------------------------------------


def import_labels(
    run: RunRecord, path: Path, *, reviewer: str | None = None, check_rollouts: bool = True
) -> list[Label]:
    """Import labels from a CSV (with a header) or JSONL file; all rows are stored, or none.

    Fields: rollout_id and label (required), reviewer (else `reviewer` is used), note, time
    (default: now). With `check_rollouts`, every rollout id must be one of the run's rollouts.
    """
    path = Path(path)
    rows = _read_rows(path)
    if not rows:
        raise UserInputError(f"{path.name} has no label rows; add rows with rollout_id and label")
    known = _rollout_ids(run) if check_rollouts else None
    stamp, source = now(), f"import:{path.name}"
    labels: list[Label] = []
    first_line: dict[tuple[str, str], int] = {}
    for line, row in rows:
        where = f"{path.name} line {line}"
        unknown = sorted(k for k in row if k not in IMPORT_FIELDS)
        if unknown:
            raise UserInputError(
                f"{where}: unknown field {unknown[0]!r}; fields are {', '.join(IMPORT_FIELDS)}"
            )
        values = {k: v for k, v in row.items() if v is not None and v != ""}
        for name in REQUIRED_FIELDS:
            if name not in values:
                raise UserInputError(f"{where}, field {name}: missing; every row needs rollout_id and label")
        if "reviewer" not in values:
            if reviewer is None:
                raise UserInputError(
                    f"{where}, field reviewer: missing; add a reviewer column or --reviewer NAME"
                )
            values["reviewer"] = reviewer
        values.setdefault("time", stamp)
        label = _validated(where, {"run_id": run.run_id, "source": source, **values})
        if known is not None and label.rollout_id not in known:
            raise UserInputError(
                f"{where}, field rollout_id: {label.rollout_id!r} is not a rollout of run {run.run_id} "
                "(list them with `reprorl runs rollouts RUN --columns rollout_id`)"
            )
        key = (label.rollout_id, label.reviewer)
        if key in first_line:
            raise UserInputError(
                f"{where}, field rollout_id: {label.rollout_id} is labelled by {label.reviewer} again "
                f"(first on line {first_line[key]}); keep one row"
            )
        first_line[key] = line
        labels.append(label)
    existing = read_labels(run)
    data = b"".join(checksummed_line(x.model_dump(mode="json")) for x in [*existing, *labels])
    write_atomic(labels_path(run), data)
    return labels


def _validated(where: str, values: Mapping[str, Any]) -> Label:
    try:
        return Label.model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "row"
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "string_type":
            message = f"must be text, not {error['input']!r}"
        raise UserInputError(f"{where}, field {field}: {message}") from None


def _read_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    if not path.is_file():
        raise UserInputError(
            f"{str(path)!r} is not a file; give a .csv or .jsonl file of labels", field="--import"
        )
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark from a spreadsheet is not data
    except UnicodeDecodeError as exc:
        raise UserInputError(f"{path.name} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    if suffix == ".csv":
        return _csv_rows(path.name, text)
    if suffix in (".jsonl", ".ndjson"):
        return _jsonl_rows(path.name, text)
    raise UserInputError(f"{path.name}: unknown format {suffix or '(no suffix)'!r}; use .csv or .jsonl")


def _csv_rows(name: str, text: str) -> list[tuple[int, dict[str, Any]]]:
    reader = csv.DictReader(text.splitlines(keepends=True), restval=None)
    try:
        header = [h.strip() for h in reader.fieldnames or []]
        reader.fieldnames = header
        rows: list[tuple[int, dict[str, Any]]] = []
        for row in reader:
            if None in row:
                raise UserInputError(f"{name} line {reader.line_num}: more cells than the header has columns")
            cells = {k: v.strip() if isinstance(v, str) else v for k, v in row.items()}
            if any(cells.values()):
                rows.append((reader.line_num, cells))
    except csv.Error as exc:
        raise UserInputError(f"{name} line {reader.line_num}: not valid CSV: {exc}") from None
    return rows


def _jsonl_rows(name: str, text: str) -> list[tuple[int, dict[str, Any]]]:
    rows: list[tuple[int, dict[str, Any]]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise UserInputError(
                f"{name} line {number}: not valid JSON ({exc.msg} at column {exc.colno})"
            ) from None
        if not isinstance(value, dict):
            raise UserInputError(f"{name} line {number}: must be a JSON object with rollout_id and label")
        rows.append((number, value))
    return rows


def _rollout_ids(run: RunRecord) -> set[str]:
    # Imported here: DuckDB and pyarrow load only when an import checks its ids against the run.
    from reprorl.store.rollout_query import RolloutStore

    table = RolloutStore(run).query(columns=["rollout_id"])
    return {str(r) for r in table.column("rollout_id").to_pylist()}


# -- agreement -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Agreement:
    """How often a judge and the humans agree on pass/fail, raw and beyond chance (Cohen's kappa)."""

    judge: str
    reviewer: str | None  # None: each rollout's newest label, whoever gave it
    threshold: float
    both_pass: int
    both_fail: int
    judge_only_pass: int
    human_only_pass: int

    @property
    def n(self) -> int:
        return self.both_pass + self.both_fail + self.judge_only_pass + self.human_only_pass

    @property
    def percent(self) -> float | None:
        """Percent of rollouts both call the same; None with nothing to compare."""
        return 100.0 * (self.both_pass + self.both_fail) / self.n if self.n else None

    @property
    def kappa(self) -> float | None:
        """Cohen's kappa, (p_o - p_e) / (1 - p_e); None when undefined (no pairs, or p_e = 1)."""
        n = self.n
        if not n:
            return None
        observed = (self.both_pass + self.both_fail) / n
        judge_pass = (self.both_pass + self.judge_only_pass) / n
        human_pass = (self.both_pass + self.human_only_pass) / n
        chance = judge_pass * human_pass + (1 - judge_pass) * (1 - human_pass)
        return None if chance >= 1.0 else (observed - chance) / (1.0 - chance)

    def to_json(self) -> dict[str, Any]:
        return {
            "judge": self.judge,
            "reviewer": self.reviewer,
            "threshold": self.threshold,
            "n": self.n,
            "percent": self.percent,
            "kappa": self.kappa,
            "both_pass": self.both_pass,
            "both_fail": self.both_fail,
            "judge_only_pass": self.judge_only_pass,
            "human_only_pass": self.human_only_pass,
        }


def agreement(
    scores: Sequence[JudgeScore],
    labels: Iterable[Label],
    *,
    judge: str | None = None,
    reviewer: str | None = None,
    threshold: float = PASS_THRESHOLD,
) -> Agreement:
    """Judge vs human on the rollouts both scored; failed judgements and skipped rollouts are left out.

    Pass means a score at or above `threshold` (0.5). Without `reviewer`, each rollout's newest
    label counts, whoever gave it.
    """
    scored = [s for s in scores if s.score is not None]
    judges = sorted({s.judge for s in scored})
    if judge is None:
        if len(judges) > 1:
            raise UserInputError(
                f"scores come from several judges ({', '.join(judges)}); name one", field="judge"
            )
        judge = judges[0] if judges else ""
    by_rollout = {s.rollout_id: s.score for s in scored if s.judge == judge}
    human = latest_labels(labels, reviewer)
    counts = {(True, True): 0, (False, False): 0, (True, False): 0, (False, True): 0}
    for rollout_id, value in by_rollout.items():
        label = human.get(rollout_id)
        if label is not None and value is not None:
            counts[(value >= threshold, label.passed(threshold))] += 1
    return Agreement(
        judge=judge,
        reviewer=reviewer,
        threshold=threshold,
        both_pass=counts[(True, True)],
        both_fail=counts[(False, False)],
        judge_only_pass=counts[(True, False)],
        human_only_pass=counts[(False, True)],
    )
