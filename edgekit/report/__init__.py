"""The HTML report of benchmark runs: one self-contained file (see edgekit.report.html)."""

from edgekit.report.html import render_report, write_report

__all__ = ["render_report", "write_report"]
