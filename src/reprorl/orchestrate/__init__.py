"""Running training jobs: from a resolved spec to a recorded run."""

from reprorl.orchestrate.run.launch import create_run, spec_inputs

__all__ = ["create_run", "spec_inputs"]
