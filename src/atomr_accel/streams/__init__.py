"""GPU stream pipelines: ``Pipeline(Source, [stage, gpu_stage, ...], Sink)``; see docs/streams.md.

Bounded buffers with back-pressure end to end, the source's order kept, failed
calls retried per stage, then the stream failed with the error and every stage
stopped.
"""

from atomr_accel.streams._pipeline import Pipeline, Sink, Source, Stage, gpu_stage, stage

__all__ = ["Pipeline", "Sink", "Source", "Stage", "gpu_stage", "stage"]

from atomr_accel._public import publish as _publish  # a lazily imported package

_publish(__name__)  # its names report this module (see atomr_accel._public)
