"""REPORT: the tuning result as Markdown, HTML (with SVG charts) and a terminal page.

It reads the result document (schema ``vkit.tune/1``) only, and imports nothing of vkit
but ``vkit.errors`` and ``vkit.state`` (the atomic writer); never ``vkit.cli``.

- ``render``: the front door (``render_markdown``, ``render_html``, ``render_terminal``,
  ``write_report``, ``ReportWriteError`` and the text helpers the tests use); no logic.
- ``model``: the section model. ``build(result)`` turns the result into a ``Report``, an
  ordered list of typed sections (heading, key facts, tables as header and rows, notes,
  figures with their chart data), built once and drawn by every format.
- ``view``: the result read once, defensively (``View``); ``text``: names, units and
  rounding of numbers, metrics and configurations, shared by all formats.
- ``plots``: what each figure shows (the SVG charts' series, the terminal plot's marks).
- ``charts``: the SVG chart library (``svg_scatter``, ``svg_lines``, ``draw``) and the
  axis maths the terminal plot shares.
- ``markdown``, ``html``, ``terminal``: one renderer each, from the section model to text.
- ``files``: ``write_report``, the three files written atomically.

Page rules: the HTML is for air-gapped machines (inline CSS and SVG, no script, no font, no
link) and XHTML-compatible, so ``xml.etree`` parses it whole; each plotted marker carries
``data-series``, ``data-config`` (the trial id), ``data-x`` and ``data-y``, each series group
its ``data-count``. Every number in the Markdown is one of the result's own numbers
(rounded), never a derived one, except the number of trials. Order of the report: the
SIMULATED banner, the goal, the baseline with σ, every trial with its verdict and why, the
knee, the Pareto configurations with their dominance rates, the recommendation with the
exact ``vllm serve`` flags, the stop rule, the drift checks, the warnings, the soak
recommendation. Missing optional keys are said to be missing, not guessed.
"""
