"""Primitive ops as Function subclasses, grouped by kind."""
