"""A policy-gradient update on the tiny model: advantages move the logprobs the right way."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from reprorl.algos import GSPO, NoCorrection, PPOClip, register_advantage
from reprorl.config.advantage import ADVANTAGES
from reprorl.config.spec import LearningSpec
from reprorl.orchestrate.pipeline.steps import group_data, learning_rate
from reprorl.policy import tiny_model
from reprorl.trainer import AdamParams, Datum, LocalTrainer
from reprorl.types import Reward, ScoreFailure, Split, Termination, Trajectory, Turn, exclusion


def _traj(group: str, member: int, reward: float, tokens: tuple[int, ...]) -> Trajectory:
    turn = Turn(
        index=0, prompt_token_ids=(5, 6, 7), token_ids=tokens, logprobs=tuple(-1.0 for _ in tokens), seed=1
    )
    return Trajectory(
        run_id="r",
        rollout_id=f"r/{group}/{member}",
        group_id=group,
        split=Split.TRAIN,
        task_id=group,
        task_hash="h",
        turns=(turn,),
        reward=Reward(total=reward, verifier_version="v"),
        termination=Termination.ANSWERED,
    )


def test_group_data_centres_rewards_and_drops_flat_groups() -> None:
    learning = LearningSpec(owner="o", advantage="dr_grpo", drop_zero_variance_groups=True)
    trajectories = [
        _traj("a", 0, 1.0, (8, 9)),
        _traj("a", 1, 0.0, (9, 8)),
        _traj("b", 0, 1.0, (8,)),
        _traj("b", 1, 1.0, (9,)),
        _traj("c", 0, 0.0, (8,)).model_copy(update={"termination": Termination.INFRA_ERROR}),
    ]
    data, stats = group_data(trajectories, learning)
    assert [d.advantage for d in data] == [0.5, -0.5]
    assert stats == {"zero_variance_groups": 1.0, "zero_variance_share": 0.5}
    kept, _ = group_data(trajectories, learning.model_copy(update={"drop_zero_variance_groups": False}))
    assert [d.advantage for d in kept] == [0.5, -0.5, 0.0, 0.0]
    # The spec's estimator is the one used, by its registered name.
    raft, _ = group_data(trajectories, learning.model_copy(update={"advantage": "raft"}))
    assert [d.advantage for d in raft] == [0.5, 0.0]


def test_an_advantage_estimator_registers_by_name() -> None:
    class Ranked:
        name = "ranked_test"

        def __call__(self, rewards: torch.Tensor) -> torch.Tensor:
            return rewards.argsort().argsort().float()

    with pytest.raises(
        ValidationError, match="no advantage estimator 'ranked_test'; advantage estimators: dr_grpo"
    ):
        LearningSpec(owner="o", advantage="ranked_test")
    try:
        register_advantage(Ranked)
        learning = LearningSpec(owner="o", advantage="ranked_test")
        data, _ = group_data([_traj("a", 0, 1.0, (8,)), _traj("a", 1, 0.0, (9,))], learning)
        assert [d.advantage for d in data] == [1.0, 0.0]
    finally:
        ADVANTAGES.remove("ranked_test")


def test_unscored_and_platform_failed_rollouts_enter_no_group() -> None:
    """An unscored member is left out of its group: counted as reward 0, it would shift the group's
    mean and give its siblings advantages no verifier produced."""
    learning = LearningSpec(owner="o", advantage="dr_grpo", drop_zero_variance_groups=False)
    timed_out = _traj("a", 2, 0.0, (7,)).model_copy(
        update={"reward": None, "score_failure": ScoreFailure.VERIFIER_TIMEOUT}
    )
    sandbox = _traj("a", 3, 0.0, (7,)).model_copy(update={"termination": Termination.SANDBOX_ERROR})
    judged = _traj("a", 4, 0.0, (7,)).model_copy(
        update={"reward": None, "score_failure": ScoreFailure.JUDGE_ERROR}
    )
    planted = _traj("a", 5, 0.0, (6,)).model_copy(update={"score_failure": ScoreFailure.AGENT_STATE})
    group = [_traj("a", 0, 1.0, (8, 9)), _traj("a", 1, 0.0, (9, 8)), timed_out, sandbox, judged]
    data, _ = group_data(group, learning)
    assert [d.advantage for d in data] == [0.5, -0.5]
    assert [exclusion(t) for t in group] == [None, None, "verifier_timeout", "sandbox_error", "judge_error"]
    # A zero the agent earned by breaking its verifier's state is the agent's: it trains.
    data, _ = group_data([*group, planted], learning)
    assert [round(d.advantage, 4) for d in data] == [0.6667, -0.3333, -0.3333]


def test_learning_rate_schedules() -> None:
    spec = LearningSpec(owner="o", lr=0.5, steps=10, warmup_steps=2, schedule="linear")
    assert [round(learning_rate(spec, s), 3) for s in (0, 1, 2, 6)] == [0.25, 0.5, 0.5, 0.25]
    assert learning_rate(spec.model_copy(update={"schedule": "cosine"}), 10) < 1e-9
    assert learning_rate(spec.model_copy(update={"schedule": "constant"}), 9) == 0.5


def test_a_ppo_step_raises_the_rewarded_sequence_and_lowers_the_other() -> None:
    model = tiny_model(0)
    trainer = LocalTrainer(model.model, model.tokenizer, base_hash=model.base_hash)
    prompt = (5, 6, 7)
    good, bad = (20, 21, 22), (30, 31, 32)
    data = [
        Datum(prompt + good, (0, 0, 0, 1, 1, 1), (0, 0, 0, *([0.0] * 3)), advantage=1.0),
        Datum(prompt + bad, (0, 0, 0, 1, 1, 1), (0, 0, 0, *([0.0] * 3)), advantage=-1.0),
    ]
    before = trainer.token_logprobs(data)
    # Behaviour logprobs as the sampler would have recorded them: the current policy's own.
    data = [
        Datum(d.input_ids, d.mask, (0.0, *lp.tolist()), d.advantage)
        for d, lp in zip(data, before, strict=True)
    ]
    weights = [p.detach().clone() for p in trainer.params]
    stats = trainer.forward_backward(data, PPOClip(correction=NoCorrection()))
    trainer.optim_step(AdamParams(lr=1e-2))
    after = trainer.token_logprobs(data)
    assert stats["clip_frac_high"] == 0.0 and stats["is_weight_mean"] == 1.0
    assert float(after[0][2:].sum()) > float(before[0][2:].sum())
    assert float(after[1][2:].sum()) < float(before[1][2:].sum())
    assert any(not torch.equal(a, b) for a, b in zip(weights, trainer.params, strict=True))


def _gradients(data: list[Datum], loss: object, micro_batch: int) -> list[torch.Tensor]:
    model = tiny_model(0)
    trainer = LocalTrainer(model.model, model.tokenizer, base_hash=model.base_hash, micro_batch=micro_batch)
    trainer.forward_backward(data, loss)  # type: ignore[arg-type]
    return [p.grad.clone() for p in trainer.params if p.grad is not None]


def test_micro_batches_are_weighted_as_the_loss_averages() -> None:
    """Split one sequence per micro-batch, a sequence-level loss gets the gradient of the whole batch:
    each micro-batch is weighted by its share of the sequences, not of the tokens."""
    prompt = (5, 6, 7)
    data = [
        Datum((*prompt, 20), (0, 0, 0, 1), (0.0,) * 4, advantage=1.0),
        Datum((*prompt, 30, 31, 32, 33, 34), (0, 0, 0, 1, 1, 1, 1, 1), (0.0,) * 8, advantage=-1.0),
        Datum((*prompt, 40, 41), (0, 0, 0, 1, 1), (0.0,) * 5, advantage=0.5),
    ]
    for loss in (GSPO(1e-3, 1e-3, NoCorrection()), PPOClip(correction=NoCorrection())):
        whole, split = _gradients(data, loss, 8), _gradients(data, loss, 1)
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(whole, split, strict=True))

    class TokenWeightedGSPO(GSPO):
        mean = "token"  # what the trainer did to every loss before losses said how they average

    wrong = _gradients(data, TokenWeightedGSPO(1e-3, 1e-3, NoCorrection()), 1)
    whole = _gradients(data, GSPO(1e-3, 1e-3, NoCorrection()), 8)
    assert not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(whole, wrong, strict=True))
