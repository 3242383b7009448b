"""Op dataclasses, one module per library."""
