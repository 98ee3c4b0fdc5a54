"""What-if studies and their reports.

``run_config`` (one run's config: its id, its moot settings, its name beside the base), ``spec``
(a TOML study: source, base settings, grids, seeds), ``runner`` (one run -> one record),
``store`` (results.jsonl, appended as runs finish), ``execute`` (process pool or Ray, resumable),
``results`` (runs, settings over seeds, slices, grids), ``noise`` (is a difference real),
``load`` (below, near or past saturation), ``claims`` (a finding's pieces: rankings within noise,
comparisons in words), ``findings`` (sentences judged against noise),
``offload`` (a grid over the KV offload size and policy read as one sweep), the report's pages
(``style``, ``table_pages``, ``grid_pages``, ``offload_pages``, ``load_pages``, ``pages``,
``paper_pages``), ``pdf`` and ``html`` (the same pages as PDF or one HTML file), ``presets``
(``demo``, ``kwon2023``) and ``cli`` (``pagesim study / report / demo``).
"""
