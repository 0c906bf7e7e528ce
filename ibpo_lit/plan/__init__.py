"""The plan of a run before any GPU: memory per GPU by phase, the correction budget, time and
timeout (`ibpo_lit.plan.plan`; the command is `python -m ibpo_lit plan`, `ibpo_lit.plan.cli`)."""
