"""Several ranks of one training job as one: :class:`~nbdebug.job.job.Job` (first non-finite rank, per-rank
hits and step summaries, rank-vs-rank compare, control of every rank at a step boundary) and
:class:`~nbdebug.job.summary.StepSummary` (what a job keeps per rank and step)."""

from __future__ import annotations

from ..features import register
from .job import Job, NonFinite
from .summary import StepSummary, summarize_table

register("job", __name__, "Job")  # nbdebug.load(multi-rank dump).job

__all__ = ["Job", "NonFinite", "StepSummary", "summarize_table"]
