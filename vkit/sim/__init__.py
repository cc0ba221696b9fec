"""vkit's embedded vLLM simulator: ``bin/sim_server`` over this package.

- ``profiles``   built-in accelerators and models (published specs)
- ``config``     vLLM V1's defaults, validation and KV-cache sizing, with vLLM's failure texts
- ``engine``     the V1 scheduler + KV block manager in virtual time
- ``steptime``   how long a step takes: the roofline ``CostModel`` and the ``Noise`` on it
- ``metrics``    vLLM's Prometheus metrics and text exposition (and a small parser)
- ``tokenizer``  the simple deterministic tokenizer and chat template
- ``http``       the HTTP/1.1 side: connections, request parsing, chunked SSE framing, error bodies
- ``api``        the OpenAI-compatible endpoints, /version, /health, /metrics, /sim/stats, and the
  mapping of a request onto an engine ``Request``
- ``serve``      ``SimSettings``, start-up, the asyncio loop, the engine loop that maps virtual
  time to wall time, crash and shutdown
- ``server``     the former single module's names, re-exported from ``http``, ``api`` and ``serve``
- ``vlog``       vLLM-format log lines
- ``starts``     the start count a restart's noise level is drawn from (``--sim-start-file``)
- ``harness``    driving the engine in pure virtual time (tests, quick what-ifs)
- ``predict``    steady-state what-ifs on the engine in virtual time (``bin/sim_predict``)
- ``calibrated`` the step-cost model with fitted parameters and its profile file (``--sim-profile``)
- ``calibrate``  fitting those parameters to measured runs (``bin/sim_calibrate``)

The engine has no I/O and takes time as an argument, so it can be driven in pure
virtual time (see ``vkit.sim.harness``) for fast, deterministic experiments. The server
keeps no module-level state: the event loop's selector is made by ``serve`` and handed on.
"""
