"""Serving engine: scheduler (rank 0 bookkeeping) -> StepPlan -> ModelRunner.execute (every rank)."""
