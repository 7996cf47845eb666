"""Oracle demonstrations recorded through the model's token path, some deliberately imperfect."""

from __future__ import annotations

import asyncio

from reprorl.policy import tiny_model
from reprorl.policy.chat import ChatRenderer
from reprorl.rollout import FAMILIES
from reprorl.rollout.demos import GUESS, collect_demonstrations
from reprorl.types import Split, Termination


def test_demonstrations_are_token_level_rollouts_of_the_oracle() -> None:
    model = tiny_model(0)
    renderer = ChatRenderer(model.tokenizer)
    tasks = [
        *FAMILIES["calculator"].generate(0, train=4, eval=0, holdout=0)[Split.TRAIN].tasks,
        *FAMILIES["sql"].generate(0, train=2, eval=0, holdout=0)[Split.TRAIN].tasks,
    ]
    demos = asyncio.run(collect_demonstrations(tasks, renderer, run_id="d", seed=0, imperfect_fraction=0.5))
    guesses = [d for d in demos if d.turns[0].text == GUESS]
    assert len(guesses) == 3
    for demo in demos:
        assert demo.termination is Termination.ANSWERED
        assert all(t.rerender_ok for t in demo.turns)
        assert demo.turns[0].policy_version.startswith("oracle:")
        assert demo.prompt_template_hash == "" or demo.prompt_template_hash == renderer.template_hash
        final = demo.turns[-1]
        assert final.token_ids[-1] == model.tokenizer.convert_tokens_to_ids("<|im_end|>")
        expected = 0.0 if demo in guesses else 1.0
        assert demo.reward is not None and demo.reward.total == expected, demo.rollout_id
    honest = [d for d in demos if d not in guesses]
    assert all(len(d.turns) >= 2 and d.turns[0].tool_calls for d in honest)
    again = asyncio.run(collect_demonstrations(tasks, renderer, run_id="d", seed=0, imperfect_fraction=0.5))
    assert [[t.token_ids for t in d.turns] for d in again] == [[t.token_ids for t in d.turns] for d in demos]
