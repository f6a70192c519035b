"""Import-neutral spawn targets for sglang-launch children.

``bootstrap.run(spec)`` is the ``multiprocessing`` spawn target of every child (scheduler, HTTP,
either runtime). It initializes the platform, registers and applies plugin hooks, and only then
decodes the ``ServerArgs`` payload and imports the worker code, reporting every phase to the
supervisor over ZeroMQ (``bootstrap.messages``).

Importing this package loads only the standard library and bootstrap's own modules: msgspec, zmq,
platforms, hooks and the worker are imported inside ``run()``, in the child, in order. The wire
format lives in ``bootstrap.messages`` (import it explicitly; it needs msgspec).
"""

from bootstrap.context import WorkerContext
from bootstrap.payload import FORMAT as PAYLOAD_FORMAT
from bootstrap.payload import VERSION as PAYLOAD_VERSION
from bootstrap.payload import PayloadError, decode_payload, encode_payload
from bootstrap.phases import DOING, EXIT_CODES, EXIT_PARENT_GONE, PHASES, phase_of_exit_code
from bootstrap.runner import WorkerReturned, run, runtime_steps
from bootstrap.spec import ProcessSpec
from bootstrap.targets import TargetError, resolve

__all__ = [
    "DOING",
    "EXIT_CODES",
    "EXIT_PARENT_GONE",
    "PAYLOAD_FORMAT",
    "PAYLOAD_VERSION",
    "PHASES",
    "PayloadError",
    "ProcessSpec",
    "TargetError",
    "WorkerContext",
    "WorkerReturned",
    "decode_payload",
    "encode_payload",
    "phase_of_exit_code",
    "resolve",
    "run",
    "runtime_steps",
]
