"""The training pipeline: one loop, composed of a source of batches, an executor and a timing."""
