"""Tools the model calls inside its reasoning; the tool, not the model, writes each result.

    calculator  GSM8K's annotation: the model writes `<<48/2=`, the tool writes `24>>`
    python      the model writes `<python>CODE</python>`, the tool writes `<output>OUT</output>`

Tool-written tokens are observations, not actions: they are not in the SFT loss, nor in the RL
policy loss or KL, and decoding forces them into the row that closed the call.
"""

from __future__ import annotations

#: every tool a config, an eval or a server may name
NAMES = ("calculator", "python")
