"""The run spec: the four decisions of a training run (model, data, learning, evaluation).

Each decision has an `owner` who answers for it. The spec is frozen, refuses unknown keys, and
refers to artifacts only through pinned references; its resolved form is hashed and stored
before step 0, so a result can always be traced back to exactly this document.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from reprorl.config.advantage import AdvantageName
from reprorl.config.agent import AgentSpec
from reprorl.config.base import Owner, SpecModel
from reprorl.config.data import DataSpec, NoiseSpec
from reprorl.config.loss import LossTable, default_loss
from reprorl.config.model import FullFineTune, LoraAdapter, ModelSpec, RemoteInference
from reprorl.hashing import content_hash
from reprorl.refs import ArtifactRef

__all__ = [
    "BudgetSpec",
    "DataSpec",
    "EvaluationSpec",
    "FullFineTune",
    "KLPenalty",
    "LearningSpec",
    "LoraAdapter",
    "ModelSpec",
    "NoiseSpec",
    "PipelineSpec",
    "PriceTable",
    "RemoteInference",
    "RollbackRule",
    "RunSpec",
]


class KLPenalty(SpecModel):
    """KL regularisation toward a reference policy: the base model, or the policy RL starts from."""

    estimator: Literal["off", "k1", "k2", "k3"] = Field(
        default="off", description="Estimator of KL(pi || ref) used in the loss; 'off' = none."
    )
    coef: float = Field(default=0.0, ge=0.0, description="Weight of the KL term in the loss.")
    reference: Literal["base", "initial"] = Field(
        default="base",
        description="The policy KL is measured against, in the loss and in train/kl_k3. 'base': the "
        "base model (the adapter off, or a frozen copy of every weight). 'initial': the policy RL "
        "starts from (after the SFT warm start, or model.init_adapter), frozen at step 0 (event "
        "kl_reference): it holds a warm-started policy near its demonstrations where the base would "
        "pull it back toward the untrained model.",
    )
    monitor_every: int = Field(
        default=1,
        ge=0,
        description="With no KL term (coef 0), measure KL to the reference (train/kl_k3, a health "
        "metric) every this many steps; each costs a forward pass of the reference over the batch, "
        "about half the update's FLOPs. 0: never. With a KL term it is measured every step.",
    )

    def measured_at(self, step: int) -> bool:
        """Whether the update of `step` computes the reference's logprobs."""
        return self.coef > 0 or (self.monitor_every > 0 and step % self.monitor_every == 0)

    @model_validator(mode="after")
    def _coef_needs_estimator(self) -> KLPenalty:
        if self.estimator == "off" and self.coef > 0:
            raise ValueError("coef > 0 needs an estimator (k1, k2 or k3)")
        return self


class PipelineSpec(SpecModel):
    """How rollouts reach the trainer: which groups a step trains on, how stale their weights may be,
    how many workers sample them, and which model turns are sampled together. One loop runs every
    combination; `max_staleness = 0` is synchronous training (each step samples from the weights it
    then trains), whether the workers are in this process or Ray actors (`reprorl run --ray`)."""

    source: Literal["planned", "arrival"] = Field(
        default="planned",
        description="Which groups a step trains on. `planned`: the groups drawn for that step, sampled "
        "from the version max_staleness names (batches never depend on timing). `arrival`: the first "
        "groups to finish, earliest staleness deadline first, each sampled from the newest version the "
        "bound lets it use; the trainer waits only for a group at its deadline, but which step trains "
        "which group depends on timing (each step's `batch_assembled` event says, and `reprorl "
        "reproduce` follows it).",
    )
    max_staleness: int = Field(
        default=0,
        ge=0,
        description="Policy versions a sample may lag behind the weights it trains. Step s samples from "
        "the weights after update s - max_staleness (never older than the last eval point); 0 is "
        "synchronous: sample, then train, every step.",
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Rollout workers a batch's groups are dealt to, each sampling its share in batches "
        "of its own (so the count shapes the results); in this process, or Ray actors with `reprorl "
        "run --ray` (the same results either way).",
    )
    lockstep: Literal["batch", "group", "ready"] = Field(
        default="batch",
        description="Whose model turns wait for each other to be sampled as one batch: every episode "
        "running at once (`batch`: the largest batches) or a group's members only (`group`: a turn "
        "waits for its own group's slowest tool call, not the batch's); with these, batches never "
        "depend on timing. `ready`: a group's members wait for each other, then every group waiting "
        "when the sampler comes free is sampled together, across batches (which turns share a batch "
        "depends on timing; each turn records it, for replay and for `reprorl reproduce` to follow).",
    )

    @model_validator(mode="after")
    def _arrival_lags(self) -> PipelineSpec:
        if self.source == "arrival" and self.max_staleness == 0:
            raise ValueError(
                "source = 'arrival' with max_staleness = 0 trains exactly the groups 'planned' does, "
                "in the same order; set max_staleness >= 1 for arrival order, or source = 'planned'"
            )
        return self


class LearningSpec(SpecModel):
    """How the policy is updated from its rollouts."""

    owner: Owner
    loss: LossTable = Field(
        default_factory=default_loss,
        description="Policy-gradient objective, a table chosen by `kind` whose other keys are that loss's "
        "own (see the loss tables below): `ppo_clip` (PPO clip against the pre-update weights), "
        "`ppo_ewma` (against their moving average), `reinforce` (the group baseline, no clipping), "
        "`gspo` (a sequence-level ratio), `cispo` (a clipped, stopped importance weight on every token), "
        "or a loss an installed package registers. A name alone (`loss = 'gspo'`) takes its defaults.",
    )
    advantage: AdvantageName = Field(
        default="dr_grpo",
        description="Group advantage estimator, by registered name: 'grpo' ((R - mean) / std), "
        "'dr_grpo' (R - mean, no std), 'rloo' (leave-one-out baseline), 'raft' (max(R - mean, 0): "
        "only members above their group's mean learn; a sharp warm start's hot samples are not "
        "pushed down).",
    )
    lr: float = Field(default=1e-5, gt=0.0, lt=1.0, description="Peak learning rate.")
    schedule: Literal["constant", "linear", "cosine"] = Field(
        default="constant", description="Learning-rate schedule after warmup."
    )
    warmup_steps: int = Field(default=0, ge=0, description="Linear warmup steps.")
    steps: int = Field(
        default=20,
        ge=0,
        description="RL optimizer steps to train for; 0 runs the SFT warm start alone, measured by the "
        "eval point at step 0 (an SFT-only run, e.g. the equal-compute control of an RL run).",
    )
    group_size: int = Field(default=8, ge=2, description="Rollouts per task (G) per step.")
    tasks_per_step: int = Field(default=4, ge=1, description="Tasks (groups) sampled per step.")
    kl: KLPenalty = Field(default_factory=KLPenalty)
    tis_cap: float = Field(
        default=2.0, ge=1.0, description="Truncated importance-sampling cap vs behaviour policy."
    )
    checkpoint_every: int = Field(
        default=1,
        ge=1,
        description="Save a resumable checkpoint every N steps, before the last; after the last step the "
        "trained weights are saved and registered instead (runs/<id>/adapter).",
    )
    keep_checkpoints: int = Field(default=2, ge=1, description="Newest checkpoints kept on disk.")
    pipeline: PipelineSpec = Field(default_factory=PipelineSpec)
    correction: Literal["tis", "mis", "none"] = Field(
        default="tis",
        description="Importance correction of the gap between the behaviour (sampling) and proximal "
        "policies: truncated IS, masked IS, or none (an explicit choice, recorded in async runs).",
    )
    temperature: float = Field(default=1.0, ge=0.0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(default=0, ge=0, description="Top-k sampling; 0 = off.")
    max_tokens: int = Field(default=256, ge=1, description="Max new tokens per model turn.")
    max_turns: int = Field(default=6, ge=1, description="Max model turns per episode.")
    episode_wall_s: float = Field(
        default=1800.0, gt=0.0, description="Wall-clock limit of one episode, sampling included."
    )
    rollout_concurrency: int = Field(
        default=32,
        ge=1,
        description="Episodes run at once; their model turns are sampled together (it shapes the batches).",
    )
    drop_zero_variance_groups: bool = Field(
        default=True, description="Skip groups whose rewards are all equal (no signal); counted."
    )
    deterministic_cuda: bool = Field(
        default=True,
        description="On a GPU, deterministic kernels and a fixed cuBLAS workspace, so a run repeats bit "
        "for bit (slower); False trades that for speed. CPU runs are deterministic either way.",
    )
    tool_alarm_steps: int = Field(
        default=0,
        ge=0,
        description="Watch tool-level exploration (seed 001): run each family's oracle once on the train "
        "tasks, log each step's calls of the tools it needs, and raise a tool_unexplored event when one "
        "has not run in this many consecutive steps that drew its family. 0: no watch (the oracle pass "
        "runs every family's verifier on up to 64 tasks each, which a run may not want to pay).",
    )
    sft_steps: int = Field(default=0, ge=0, description="SFT warm-start steps before RL.")
    sft_lr: float = Field(default=1e-3, gt=0.0, lt=1.0, description="Learning rate of the SFT warm start.")
    sft_schedule: Literal["constant", "linear", "cosine"] = Field(
        default="constant",
        description="Learning-rate schedule of the warm start, from sft_lr at its first step toward zero "
        "after its last. At a constant rate the mix a warm start ends with (tool calls against the "
        "imperfect demonstrations' direct answers) swings from step to step: calculator's three seeds "
        "ended 64 steps at 0.87, 0.29 and 0.66 held out, and at 0.79, 0.78 and 0.70 under 'cosine'.",
    )
    sft_batch_size: int = Field(default=8, ge=1, description="Demonstrations per SFT step.")
    sft_temperature: float = Field(
        default=1.0,
        gt=0.0,
        description="Temperature the warm start's cross-entropy fits the demonstrations at (logits "
        "divided by it); 1.0 is plain cross-entropy. RL sampling below it sharpens what the "
        "demonstrations taught (held-out success rises, groups agree more often); at or above it, "
        "group members differ more and RL sees more signal.",
    )
    sft_imperfect_fraction: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Share of SFT demos made deliberately wrong."
    )
    sft_demonstrations: int | None = Field(
        default=None,
        ge=1,
        description="How many train tasks get an oracle demonstration for the warm start, drawn with "
        "the run's seed (recorded in the sft_done event), each family of a mixed train set its share "
        "in proportion to its tasks; None: every one. RL still draws from every train task: its "
        "verifier scores tasks nobody demonstrated.",
    )


class RollbackRule(SpecModel):
    """A rule that stops the run or reverts to the last good checkpoint when it fires."""

    when: Literal[
        "required_task_decline",
        "unsafe_action",
        "cost_cap",
        "tool_failure_rate",
        "reward_hacking",
        "metric_below",
        "integrity_above",
    ] = Field(description="Condition that fires the rule.")
    action: Literal["stop", "revert"] = Field(default="stop", description="What firing does.")
    metric: str | None = Field(default=None, description="Metric watched by 'metric_below'.")
    threshold: float | None = Field(default=None, description="Limit the condition compares to.")

    @model_validator(mode="after")
    def _metric_rule_is_complete(self) -> RollbackRule:
        if self.when == "metric_below" and (self.metric is None or self.threshold is None):
            raise ValueError("'metric_below' needs both metric and threshold")
        return self


class EvaluationSpec(SpecModel):
    """How success is measured, declared before training starts."""

    owner: Owner
    suites: tuple[ArtifactRef, ...] = Field(
        min_length=1, description="Frozen eval suites (task set + scoring), e.g. 'calc-eval@v1'."
    )
    every_steps: int = Field(default=10, ge=1, description="Evaluate every N training steps.")
    samples_per_task: int = Field(default=1, ge=1, description="Samples per eval task (pass@k).")
    temperature: float | None = Field(
        default=None,
        ge=0.0,
        description="Sampling temperature of eval rollouts; None: learning.temperature. Training may "
        "sample hotter than it is measured at (exploration where a warm start left little entropy) "
        "while every eval point measures the policy the same way.",
    )
    thresholds: dict[str, float] = Field(
        default_factory=dict, description="Acceptance thresholds, metric name to minimum."
    )
    rollback: tuple[RollbackRule, ...] = Field(default=(), description="Rules that stop or revert.")
    max_unscored_share: float | None = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Stop the run when more than this share of a step's (or an eval point's) rollouts "
        "is left unscored by the platform, the verifier or the judge; that step is not trained on. "
        "None = never stop for it (the rollouts are still left out and counted).",
    )
    allow_leakage: bool = Field(
        default=False, description="Run even if train and eval tasks overlap (recorded)."
    )


class PriceTable(SpecModel):
    """What compute costs; every rollout's `cost_usd` is priced with it (0 = free)."""

    prompt_usd_per_mtok: float = Field(
        default=0.0, ge=0.0, description="USD per million prompt tokens (hosted inference)."
    )
    completion_usd_per_mtok: float = Field(
        default=0.0, ge=0.0, description="USD per million sampled tokens (hosted inference)."
    )
    cpu_usd_per_hour: float = Field(default=0.0, ge=0.0, description="USD per CPU-hour of local compute.")

    def cost(self, prompt_tokens: int, completion_tokens: int, cpu_s: float) -> float:
        return (
            prompt_tokens * self.prompt_usd_per_mtok / 1e6
            + completion_tokens * self.completion_usd_per_mtok / 1e6
            + cpu_s * self.cpu_usd_per_hour / 3600.0
        )


class BudgetSpec(SpecModel):
    """Caps checked before each step and eval point: once one is spent the run stops (`stopped`, with a
    `stopped_by_rule` event naming it; the step that crossed it is kept); none = no cap."""

    prices: PriceTable = Field(default_factory=PriceTable, description="Prices for cost accounting.")
    max_usd: float | None = Field(
        default=None,
        gt=0.0,
        description="Total cost cap (a cap of 0 would stop the run before its first step: leave it out "
        "for none): every rollout's cost_usd (train and eval, retries included) plus the "
        "updates' CPU time at cpu_usd_per_hour.",
    )
    max_wall_s: float | None = Field(
        default=None, gt=0.0, description="Cap on the seconds spent in rollouts, updates and eval points."
    )
    max_tokens: int | None = Field(
        default=None, gt=0, description="Cap on sampled tokens, train and eval, retries included."
    )


class RunSpec(SpecModel):
    """A complete, self-contained description of one training run."""

    name: str = Field(default="run", min_length=1, max_length=128, description="Label for people; not an id.")
    seed: int = Field(ge=0, lt=2**63, description="Root seed; every sampler and shuffler derives from it.")
    model: ModelSpec
    data: DataSpec
    learning: LearningSpec
    evaluation: EvaluationSpec
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    agent: AgentSpec | None = Field(
        default=None,
        description="An agent program (command or callable) that drives each episode through the "
        "agent proxy instead of reprorl's own tool loop.",
    )

    @model_serializer(mode="wrap")
    def _unset_sections_left_out(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A section added later is left out of every dump while unset, so the records of earlier
        # runs and the spec documents they hash read the same as before it existed.
        data: dict[str, Any] = handler(self)
        if data.get("agent", ...) is None:
            del data["agent"]
        return data

    @model_validator(mode="after")
    def _screen_needs_planned_steps(self) -> RunSpec:
        if self.data.screen is not None and self.learning.pipeline.source == "arrival":
            raise ValueError(
                "data.screen draws each step's tasks from the verdicts of the steps trained before it, "
                "which a step of arrival order does not have; set learning.pipeline.source = 'planned' "
                "or remove data.screen"
            )
        return self

    def spec_hash(self) -> str:
        """`sha256:` of the canonical JSON of the spec; equal specs hash equally."""
        return content_hash(self.model_dump(mode="json"))
