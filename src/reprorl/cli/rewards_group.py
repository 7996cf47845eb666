"""`reprorl rewards`: how far a run's rewards can be trusted — exploit probes, LLM judges, human labels."""

from __future__ import annotations

import typer

from reprorl.cli import audit_rewards_cmd, judge_cmd, review_cmd, verifier_errors_cmd

app = typer.Typer(
    help="Rewards under test: audit verifiers and judges, judge and label rollouts, measure scorer errors.",
    no_args_is_help=True,
)
app.command("audit")(audit_rewards_cmd.audit_rewards)
app.command("judge")(judge_cmd.judge)
app.command("review")(review_cmd.review)
app.command("errors")(verifier_errors_cmd.verifier_errors)
