"""The report as text: a screen or two (short), and every step and shape (full)."""
