"""vkit: tune a vLLM server and trust the result.

Single-purpose command-line tools (``bin/``) over this thin library. Library
modules never print to stdout and never exit; they raise :class:`vkit.errors.VkitError`.
"""

__version__ = "0.1.0"
