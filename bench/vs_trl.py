"""The same GRPO workload through TRL's `GRPOTrainer` and through reprorl: seconds per step, time to a target.

Workload (both sides, in one process, from the same weights and the same prompts):

- SmolLM2-135M-Instruct (the bundled GGUF, no downloads), LoRA r=8 / alpha=16 on every linear layer
  of the blocks (q, k, v, o, gate, up, down);
- an SFT warm start done once and shared: `--sft-steps` cross-entropy steps (batches of 8, lr
  `--sft-lr`) on (prompt, answer) pairs of the calculator family's train split, a quarter of them
  deliberately wrong (answer "42"), so there is something left for RL to fix; both sides start
  from that saved adapter, with a fresh optimizer;
- single-turn calculator prompts: 4 prompts x 8 samples per step, temperature 1, at most 32 new
  tokens; reward 1 when the last number of the answer equals the reference answer, else 0;
- one update per batch at `--lr` (constant), AdamW (0.9, 0.999), grad-norm clip 1, no KL term,
  token-level mean over the batch (TRL's default `loss_type="dapo"`), clip 0.2 / 0.28, group
  advantages scaled by the group's std (`--advantage grpo`, TRL's default `scale_rewards="group"`)
  or not (`dr_grpo`, `scale_rewards="none"`).

Prompts (`--context`): the calculator family's word problems need arithmetic a 135M model cannot do
in its head (success is about 0 with the question alone), so by default the prompt is the family's
last turn: the question, the assistant's `calc` call and the tool's result; the policy must answer
with the number. `--context question` gives the bare question ("... Answer with a number.").

TRL runs with its own defaults where the workload does not fix a setting: transformers `generate`
on the (unmerged) peft model in float32, bf16 autocast in the loss where the CPU has it (`--bf16`,
both sides), gradient checkpointing on (off: `--no-trl-gradient-checkpointing`). reprorl runs its
train loop's pieces: a merged sampling snapshot refreshed after each update, the cached fused
decode, the trainer's bf16 autocast, PPO clip with truncated IS against the sampler's logprobs.

It prints, per side, mean seconds per step (step 0 left out as warm-up when there are more steps),
how many updates and seconds it took until a step's mean reward first reached `--target`, the
per-step reward curve, and the ratios reprorl / TRL. Last, reprorl's update (forward_backward and
the optimizer step) against its FLOP bound: 4 x the matmul weights x the token positions for a LoRA
adapter (6 x when every weight learns), at the rate of a large GEMM in the training's matmul dtype
measured at the start of the same run. The default target, 0.75, is the share of
correct demonstrations: after the default 8 SFT steps a step's success is about 0.45-0.5, so
reaching it takes RL. Needs TRL (`pip install -e '.[bench]'`).

    .venv/bin/python bench/vs_trl.py [--steps 20] [--lr 1e-4] [--target 0.75] [--sft-steps 8]
        [--only both|reprorl|trl] [--advantage grpo|dr_grpo] [--context tool-result|question]

The machine should be otherwise idle: the two sides run one after the other and share nothing but
the CPU, so any other load lands on one side's figures (and on a busy machine, torch's threads wait
on each other at every barrier: `--threads 1` is slower but far steadier there).
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import re
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from sampling import matmul_flops

from reprorl.actions import render_call
from reprorl.algos import CrossEntropy, DrGRPOAdvantage, GRPOAdvantage, PPOClip
from reprorl.config.spec import LoraAdapter
from reprorl.envs.families import calculator
from reprorl.envs.families.calculator import format_number
from reprorl.hashing import derive_seed
from reprorl.policy import bundled_gguf, default_cache_root, load_adapter, load_base, save_model
from reprorl.policy.chat import ChatRenderer
from reprorl.policy.models import quiet_progress
from reprorl.policy.sampling import LocalSampler, SampleRequest
from reprorl.store import Store
from reprorl.trainer import AdamParams, Datum, LocalTrainer
from reprorl.trainer.snapshot import SamplingSnapshot
from reprorl.types import Message, Role, SamplingParams, Split, Task

MODEL = "smollm2-135m-instruct"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPTS_PER_STEP = 4
GROUP = 8
MAX_TOKENS = 32
SFT_BATCH = 8
WRONG_ANSWER = "42"
CLIP_LOW, CLIP_HIGH = 0.2, 0.28
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True)
class Prompt:
    """One RL prompt: the rendered text, its token ids (the same on both sides) and the answer."""

    text: str
    ids: tuple[int, ...]
    answer: float


@dataclass(frozen=True)
class Workload:
    """What both sides start from: base weights, the warm-started adapter, the prompts of each step."""

    base_dir: Path
    adapter_dir: Path
    steps: list[list[Prompt]]


@dataclass
class Curve:
    """One side's measurements, one entry per RL step."""

    name: str
    setup_s: float = 0.0
    seconds: list[float] = field(default_factory=list)
    sample_seconds: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    update_seconds: list[float] = field(default_factory=list)  # forward_backward + optim_step
    model_flops: list[float] = field(default_factory=list)  # each update's FLOP bound (reprorl only)


def has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def reward(text: str, answer: float) -> float:
    """1 when the last number in `text` equals `answer` (thousands separators allowed), else 0."""
    found = NUMBER.findall(text)
    if not found:
        return 0.0
    try:
        value = float(found[-1].replace(",", ""))
    except ValueError:
        return 0.0
    return 1.0 if math.isclose(value, answer, rel_tol=0.0, abs_tol=1e-6) else 0.0


def messages_for(task: Task, context: str) -> list[Message]:
    """The task's question, followed (for `tool-result`) by the `calc` call and its result."""
    messages = list(task.prompt)
    if context == "tool-result":
        assert isinstance(task.reference, dict)
        call = render_call("calc", {"expression": str(task.reference["expression"])})
        messages += [
            Message(role=Role.ASSISTANT, content=call),
            Message(role=Role.TOOL, content=format_number(answer_of(task))),
        ]
    return messages


def answer_of(task: Task) -> float:
    assert isinstance(task.reference, dict)
    return float(str(task.reference["answer"]))


def adapter_spec() -> LoraAdapter:
    return LoraAdapter(rank=8, alpha=16.0, targets=TARGETS)


def prepare(args: argparse.Namespace, work: Path) -> Workload:
    """Save the base as a model folder, build the prompts, run the SFT warm start and save its adapter."""
    store = Store(work / "store")
    store.add(MODEL, bundled_gguf(), kind="model")
    # The GGUF conversion is cached outside the scratch store (derived files, safe to delete).
    loaded = load_base(f"{MODEL}@v1", store=store, cache_dir=default_cache_root())
    base_dir = work / "base"
    save_model(loaded.model, loaded.tokenizer, base_dir)
    renderer = ChatRenderer(loaded.tokenizer)
    train = calculator.generate(args.seed)[Split.TRAIN].tasks

    def prompt(task: Task) -> Prompt:
        text = renderer.render_text(messages_for(task, args.context))
        return Prompt(text, tuple(renderer.encode(text)), answer_of(task))

    prompts = [prompt(task) for task in train]
    rng = random.Random(derive_seed(args.seed, "rl-prompts"))
    steps = [rng.sample(prompts, PROMPTS_PER_STEP) for _ in range(args.steps)]

    # SFT demonstrations: the answer then the end of the turn; a fixed share answers WRONG_ANSWER.
    end = loaded.tokenizer.eos_token_id
    assert isinstance(end, int)
    sft_rng = random.Random(derive_seed(args.seed, "sft"))
    wrong = set(sft_rng.sample(range(len(prompts)), round(args.sft_wrong * len(prompts))))
    demos = []
    for i, p in enumerate(prompts):
        answer = WRONG_ANSWER if i in wrong else format_number(p.answer)
        target = (*renderer.encode(answer), end)
        demos.append(
            Datum(
                input_ids=p.ids + target,
                mask=(0.0,) * len(p.ids) + (1.0,) * len(target),
                behaviour_logprobs=(0.0,) * (len(p.ids) + len(target)),
            )
        )
    trainer = LocalTrainer.lora(
        loaded, adapter_spec(), seed=derive_seed(args.seed, "adapter-init"), autocast_bf16=args.bf16
    )
    started = time.perf_counter()
    losses = []
    for _ in range(args.sft_steps):
        batch = sft_rng.sample(demos, min(SFT_BATCH, len(demos)))
        losses.append(trainer.forward_backward(batch, CrossEntropy())["loss"])
        trainer.optim_step(AdamParams(lr=args.sft_lr))
    adapter_dir = work / "sft-adapter"
    trainer.save_adapter(adapter_dir)
    shown = " ".join(f"{x:.3f}" for x in losses) or "(no steps)"
    print(
        f"SFT warm start: {args.sft_steps} steps in {time.perf_counter() - started:.1f} s, "
        f"{len(wrong)}/{len(demos)} demonstrations wrong; loss {shown}",
        flush=True,
    )
    return Workload(base_dir, adapter_dir, steps)


def run_reprorl(work: Workload, args: argparse.Namespace) -> Curve:
    """reprorl's train-loop pieces: snapshot sampling, group advantages, PPO clip, one AdamW step."""
    curve = Curve("reprorl")
    started = time.perf_counter()
    base = load_base(work.base_dir)
    model = load_adapter(base.model, work.adapter_dir, trainable=True)
    trainer = LocalTrainer(model, base.tokenizer, base_hash=base.base_hash, autocast_bf16=args.bf16)  # type: ignore[arg-type]
    snapshot = SamplingSnapshot(trainer, getattr(torch, args.sampling_dtype))
    sampler = LocalSampler(
        snapshot.model, base.tokenizer, model_hash=base.base_hash, policy_version="", stop_strings=()
    )
    advantage: Callable[[torch.Tensor], torch.Tensor] = (
        GRPOAdvantage() if args.advantage == "grpo" else DrGRPOAdvantage()
    )
    loss = PPOClip(CLIP_LOW, CLIP_HIGH)
    params = SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS)
    curve.setup_s = time.perf_counter() - started
    for step, prompts in enumerate(work.steps):
        start = time.perf_counter()
        snapshot.refresh()
        sampler.policy_version = f"step-{step}"
        requests = [
            SampleRequest(f"{i}/{j}", p.ids, params, derive_seed(args.seed, "sample", step, i, j))
            for i, p in enumerate(prompts)
            for j in range(GROUP)
        ]
        samples = sampler.sample(requests)
        curve.sample_seconds.append(time.perf_counter() - start)
        data, rewards = [], []
        for i, p in enumerate(prompts):
            group = samples[i * GROUP : (i + 1) * GROUP]
            values = [reward(s.text, p.answer) for s in group]
            rewards.extend(values)
            for s, a in zip(group, advantage(torch.tensor(values)).tolist(), strict=True):
                data.append(
                    Datum(
                        input_ids=p.ids + s.token_ids,
                        mask=(0.0,) * len(p.ids) + (1.0,) * len(s.token_ids),
                        behaviour_logprobs=(0.0,) * len(p.ids) + s.logprobs,
                        advantage=a,
                    )
                )
        updating = time.perf_counter()
        figures = trainer.forward_backward(data, loss)
        trainer.optim_step(AdamParams(lr=args.lr))
        curve.update_seconds.append(time.perf_counter() - updating)
        curve.model_flops.append(figures["model_flops"])
        curve.seconds.append(time.perf_counter() - start)
        curve.rewards.append(statistics.fmean(rewards))
        report(curve)
    return curve


def run_trl(work: Workload, args: argparse.Namespace, scratch: Path) -> Curve:
    """TRL's GRPOTrainer on the same prompts, in order: one step = the same 4 prompts x 8 samples."""
    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    curve = Curve("trl")
    started = time.perf_counter()
    # transformers 5 renamed gradient checkpointing; TRL 1.16 still uses the old names.
    warnings.filterwarnings("ignore", message=".*removed in v6", category=FutureWarning)
    tokenizer = AutoTokenizer.from_pretrained(work.base_dir, local_files_only=True)
    with quiet_progress():
        model = AutoModelForCausalLM.from_pretrained(
            work.base_dir, dtype=torch.float32, local_files_only=True
        )
    policy = PeftModel.from_pretrained(model, work.adapter_dir, is_trainable=True, local_files_only=True)
    first = work.steps[0][0]
    if list(tokenizer(text=first.text)["input_ids"]) != list(first.ids):
        raise RuntimeError("TRL would tokenize the prompts differently from reprorl")
    # Text prompts, already rendered with the chat template: TRL tokenizes them as they are. The
    # rows are in step order and not shuffled, so step k sees the prompts reprorl's step k sees.
    rows = [{"prompt": p.text, "answer": p.answer} for prompts in work.steps for p in prompts]
    config = GRPOConfig(
        output_dir=str(scratch / "trl"),
        use_cpu=True,
        bf16=args.bf16,
        gradient_checkpointing=args.trl_gradient_checkpointing,
        per_device_train_batch_size=PROMPTS_PER_STEP * GROUP,
        gradient_accumulation_steps=1,
        num_generations=GROUP,
        generation_batch_size=PROMPTS_PER_STEP * GROUP,
        max_completion_length=MAX_TOKENS,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=len(work.steps),
        num_iterations=1,
        beta=0.0,
        epsilon=CLIP_LOW,
        epsilon_high=CLIP_HIGH,
        loss_type="dapo",
        scale_rewards="group" if args.advantage == "grpo" else "none",
        shuffle_dataset=False,
        seed=args.seed,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    began: list[float] = []

    def correct(completions: Sequence[str], answer: Sequence[float], **_: Any) -> list[float | None]:
        # Called once per step, right after generation: the time since the step began is sampling.
        curve.sample_seconds.append(time.perf_counter() - began[-1])
        values = [reward(c, a) for c, a in zip(completions, answer, strict=True)]
        curve.rewards.append(statistics.fmean(values))
        return [*values]

    class Clock(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            began.append(time.perf_counter())

        def on_step_end(self, *_: Any, **__: Any) -> None:
            curve.seconds.append(time.perf_counter() - began[-1])
            report(curve)

    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=correct,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    curve.setup_s = time.perf_counter() - started
    trainer.train()
    return curve


def report(curve: Curve) -> None:
    step = len(curve.seconds) - 1
    print(
        f"  {curve.name:<8} step {step:>3}: {curve.seconds[-1]:7.2f} s "
        f"(sampling {curve.sample_seconds[-1]:6.2f} s)  mean reward {curve.rewards[-1]:.3f}",
        flush=True,
    )


def steady(values: Sequence[float]) -> float:
    """Mean without step 0 (warm-up: weight packing, allocator, first-call costs) when there is more."""
    return statistics.fmean(values[1:] if len(values) > 1 else values)


def to_target(curve: Curve, target: float) -> tuple[int, float] | None:
    """(updates done before the first step whose mean reward >= target, seconds up to that step's end)."""
    for step, value in enumerate(curve.rewards):
        if value >= target:
            return step, sum(curve.seconds[: step + 1])
    return None


def bound_line(curve: Curve, flops_per_s: float, dtype: str) -> str:
    """The update's seconds against its FLOP bound at the matmul rate measured in this run."""
    update = steady(curve.update_seconds)
    bound = steady(curve.model_flops) / flops_per_s
    return (
        f"{curve.name} update {update:.2f} s/step; FLOP bound {bound:.2f} s "
        f"({steady(curve.model_flops) / 1e12:.2f} TFLOP at {flops_per_s / 1e9:,.0f} GFLOP/s {dtype} "
        f"matmul, measured here): {update / bound:.2f}x the bound"
    )


def summary(curves: list[Curve], target: float) -> None:
    print(
        f"\n{'side':<9}{'setup s':>9}{'s/step':>9}{'sampling':>10}{'update':>9}"
        f"{'updates→target':>16}{'s→target':>10}{'mean reward':>13}"
    )
    for c in curves:
        reached = to_target(c, target)
        sampling = steady(c.sample_seconds)
        print(
            f"{c.name:<9}{c.setup_s:>9.1f}{steady(c.seconds):>9.2f}{sampling:>10.2f}"
            f"{steady(c.seconds) - sampling:>9.2f}"
            f"{(str(reached[0]) if reached else 'not reached'):>16}"
            f"{(f'{reached[1]:.1f}' if reached else '-'):>10}{statistics.fmean(c.rewards):>13.3f}"
        )
    excluded = "step 0 excluded" if len(curves[0].seconds) > 1 else "one step only: warm-up included"
    print(f"(s/step = mean wall seconds per step, {excluded}; sampling = until the rewards; target {target})")
    if len(curves) == 2:
        ours, theirs = curves
        print(f"ratio reprorl/TRL  s/step: {steady(ours.seconds) / steady(theirs.seconds):.3f}", end="")
        a, b = to_target(ours, target), to_target(theirs, target)
        print(f"   s→target: {a[1] / b[1]:.3f}" if a and b and b[1] > 0 else "   s→target: -")
    print("\nmean reward per step")
    print("step " + "".join(f"{c.name:>9}" for c in curves))
    for step in range(max(len(c.rewards) for c in curves)):
        cells = "".join(f"{c.rewards[step]:>9.3f}" if step < len(c.rewards) else f"{'':>9}" for c in curves)
        print(f"{step:>4} {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="RL steps per side")
    parser.add_argument("--lr", type=float, default=1e-4, help="RL learning rate (constant), both sides")
    parser.add_argument("--target", type=float, default=0.75, help="success target: a step's mean reward")
    parser.add_argument("--sft-steps", type=int, default=8, help="warm-start steps (batches of 8)")
    parser.add_argument("--sft-lr", type=float, default=1e-3)
    parser.add_argument("--sft-wrong", type=float, default=0.25, help="share of wrong demonstrations")
    parser.add_argument("--only", choices=["both", "reprorl", "trl"], default="both")
    parser.add_argument("--advantage", choices=["grpo", "dr_grpo"], default="grpo")
    parser.add_argument("--context", choices=["tool-result", "question"], default="tool-result")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads, both sides")
    parser.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=has_native_bf16(),
        help="bf16 autocast in training, both sides (default: where the CPU has native bf16)",
    )
    parser.add_argument(
        "--sampling-dtype",
        choices=["float32", "bfloat16"],
        default="bfloat16" if has_native_bf16() else "float32",
        help="reprorl's sampler (the train loop's `model.sampling_dtype`); TRL generates in float32",
    )
    parser.add_argument(
        "--trl-gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="TRL's GRPOConfig default is on",
    )
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(
        f"{MODEL} LoRA r8 {'/'.join(t.removesuffix('_proj') for t in TARGETS)}; {args.steps} steps of "
        f"{PROMPTS_PER_STEP}x{GROUP} samples, {MAX_TOKENS} new tokens, lr {args.lr}, advantage "
        f"{args.advantage}, context {args.context}, bf16 {args.bf16}, threads {torch.get_num_threads()}",
        flush=True,
    )
    # The update's bound: the matmul rate of this machine in the training's matmul dtype, measured
    # before either side runs (the same threads).
    dtype_name = "bf16" if args.bf16 else "fp32"
    rate = matmul_flops(torch.bfloat16 if args.bf16 else torch.float32)
    curves = []
    with tempfile.TemporaryDirectory(prefix="reprorl-vs-trl-") as scratch:
        work = prepare(args, Path(scratch))
        gc.collect()
        if args.only in ("both", "reprorl"):
            curves.append(run_reprorl(work, args))
            gc.collect()
        if args.only in ("both", "trl"):
            curves.append(run_trl(work, args, Path(scratch)))
    summary(curves, args.target)
    for curve in curves:
        if curve.model_flops:
            print(bound_line(curve, rate, dtype_name))


if __name__ == "__main__":
    main()
