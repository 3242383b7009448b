"""GPU stream pipelines: ``Pipeline(Source, [stage, gpu_stage, ...], Sink)``; see docs/streams.md.

Bounded buffers with back-pressure end to end, the source's order kept, failed
calls retried per stage, then the stream failed with the error and every stage
stopped.
"""

from atomr_accel.streams._pipeline import Pipeline, Sink, Source, Stage, gpu_stage, stage

__all__ = ["Pipeline", "Sink", "Source", "Stage", "gpu_stage", "stage"]
