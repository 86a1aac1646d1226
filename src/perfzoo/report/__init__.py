"""The report: one registry of every output with its caption and category (:mod:`~perfzoo.report.registry`,
read by the rule files and the page alike), the tables and the HTML report (:mod:`~perfzoo.report.html`),
its answer-first index page (:mod:`~perfzoo.report.page`) and the paper figures (:mod:`~perfzoo.report.figures`)."""
