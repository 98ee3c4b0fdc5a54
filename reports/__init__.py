"""What-if studies and their PDF reports.

``spec`` (a TOML study: source, base settings, grids), ``runner`` (one run -> one record),
``store`` (results.jsonl, appended as runs finish), ``execute`` (process pool or Ray, resumable),
``results`` (slices, best settings, findings), ``pages`` / ``paper_pages`` / ``pdf`` (the report),
``presets`` (``demo``, ``kwon2023``) and ``cli`` (``pagesim study / report / demo``).
"""
