"""The report: what phasemem found as plain data (``Report``, ``Comparison``), built by one pipeline
(path or snapshot -> trace -> analysis -> report), and the budgets checked against it."""
