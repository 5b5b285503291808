"""Reporters: the report written out as text, JSON, an HTML page, a picture, or labels inside the
snapshot for memory_viz, each built from the report alone."""
