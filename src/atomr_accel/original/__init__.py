"""The original package's forms (argument orders, aliases, demo models), declared in one place."""
