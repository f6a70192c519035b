"""Built-in platforms, one module per device family, each with an ``available()`` probe.

These modules import torch only inside methods and probes, so importing one is cheap; the
selection chain imports a module only when it probes or selects that device.
"""
