"""Worked examples of plugging the owner's own models into Glassbox (see docs/models.md)."""
