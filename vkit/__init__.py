"""vkit: tune a vLLM server and trust the result.

Single-purpose command-line tools (``bin/`` → ``vkit.cli``) over this library, one package per
stage a measurement passes through: ``measure`` → ``validate`` → ``decide`` → ``apply`` →
``tune``, with ``search``, ``sim`` and ``report`` beside them. ``state`` (the state file and
logs), ``errors``, ``interrupts``, ``jsonio`` and ``environment`` (two environment fingerprints
compared) are shared by all. The library never imports
``vkit.cli``, never prints to stdout and never exits; it raises :class:`vkit.errors.VkitError`.
"""

__version__ = "0.1.0"
