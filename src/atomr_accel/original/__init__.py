"""The original package's names: its op forms, attached to the package's own ops."""
