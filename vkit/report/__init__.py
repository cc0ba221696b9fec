"""REPORT: the tuning result as Markdown, HTML (with SVG charts) and a terminal page.

``render`` holds the renderers and the chart code; it reads the result document only.
"""
