"""Experiment bookkeeping, apart from training: the arms of a comparison (``arms``), run summaries
read from TensorBoard events (``runs``, ``summary_store``), and the tables, cells and plots that
``scripts/compare.py`` and ``scripts/report.py`` make of them (``tables``, ``cells``, ``report``,
``report_plots``, ``readme_block``). Nothing in training, rollouts or rewards imports this package
(tests/test_layout.py checks it); it only reads configs and logs, except ``exact_gradient``, a
self-contained testbed that runs the ``algorithms`` formulas on a tiny enumerable policy to measure
each estimator against the exact policy gradient (``scripts/exact_gradient.py``)."""
