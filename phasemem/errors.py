"""The one exception phasemem raises for input it cannot use."""


class PhasememError(Exception):
    """Input phasemem cannot analyse. The message is one line: what is wrong and what to do.

    Example:
        >>> try:
        ...     phasemem.analyze("missing.pickle")
        ... except phasemem.PhasememError as e:
        ...     print(e)
    """


RECORD_HINT = (
    "record one with torch.cuda.memory._record_memory_history(max_entries=1_000_000) before the steps "
    "and torch.cuda.memory._dump_snapshot('snapshot.pickle') after them, or use phasemem.instrument()"
)


class NoHistory(PhasememError):
    """A snapshot with segments but no allocation history: a legacy recording
    (``_record_memory_history(True)``, torch <= 2.2, a single trace entry) or a bare list of segments
    (``torch.cuda.memory_snapshot()``). ``phasemem.analyze`` answers it with the live memory instead."""
