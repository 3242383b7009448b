"""Agent blueprints: an embedding cache, vector indexes on the CPU and on a device, a RAG
pipeline, a lease coordinator for shared device state and a DAG executor."""

__all__: list[str] = []
