"""The report as one interactive HTML page."""
