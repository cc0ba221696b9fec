"""TUNE: the state machine of a tuning run, composed from the stages before it.

``driver`` (tune's whole run and sweep's modes, on typed inputs: what the CLI calls),
``result`` (the tune result's versioned schema), ``context`` (the ``Tune`` every phase is handed, no
methods) and the phases beside it: ``seat`` (restarts with rollback), ``trial`` (one trial: APPLY → VERIFY →
VALIDATE → GATE → KEEP or REVERT, resumable from the state file), ``confirm``, ``promise`` ...; ``steps`` (the staged steps,
Bayesian search, delivery, ablation), ``knowledge`` (the knowledge base of finished runs),
``advisor`` (an advisor model's logged calls, its proposals in the Bayesian search, replay).
Imports every stage package and ``vkit.search``; nothing below imports it.
"""
