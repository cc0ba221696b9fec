"""vkit's embedded vLLM simulator: ``bin/sim_server`` over this package.

- ``profiles``  built-in accelerators and models (published specs)
- ``config``    vLLM V1's defaults, validation and KV-cache sizing, with vLLM's failure texts
- ``engine``    the V1 scheduler + KV block manager in virtual time, roofline step time
- ``metrics``   vLLM's Prometheus metrics and text exposition (and a small parser)
- ``tokenizer`` the simple deterministic tokenizer and chat template
- ``server``    the asyncio HTTP/1.1 server that maps virtual time to wall time
- ``vlog``      vLLM-format log lines
- ``predict``   steady-state what-ifs on the engine in virtual time (``bin/sim_predict``)
- ``calibrated`` the step-cost model with fitted parameters and its profile file (``--sim-profile``)
- ``calibrate`` fitting those parameters to measured runs (``bin/sim_calibrate``)

The engine has no I/O and takes time as an argument, so it can be driven in pure
virtual time (see ``vkit.sim.harness``) for fast, deterministic experiments.
"""
