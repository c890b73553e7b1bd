"""The backends by name, and the checks every open goes through (availability, precision, accuracy gate,
and the engine parity gate each kind declares).

``--backend auto`` measures the candidates this module lists (see ``autoselect``); an explicit backend or
precision that cannot run is a one-line error naming why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sac_edge.common.bundle import Bundle
from sac_edge.common.bundle_format import PRECISIONS
from sac_edge.common.errors import SacEdgeError

from .base import Backend, BackendKind, BackendOptions, gate_refusal
from .onnxrt import loader as onnxrt
from .parity_gate import SwapGate, gate_open
from .pyt import loader as pyt
from .trt import loader as trt

KINDS: dict[str, BackendKind] = {
    kind.name: kind
    for kind in (
        trt.KIND,
        onnxrt.TENSORRT_EP,
        onnxrt.CUDA,
        onnxrt.CPU,
        pyt.KIND,
    )
}
BACKEND_CHOICES = ("auto", *KINDS)


class Candidate(NamedTuple):
    """A backend x precision that can run here from this bundle, or the reason it cannot."""

    backend: str
    precision: str
    refusal: str | None


def kind(name: str) -> BackendKind:
    """The backend called ``name`` (one-line error listing the known ones)."""
    if name not in KINDS:
        raise SacEdgeError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_CHOICES)}")
    return KINDS[name]


def check_precision(name: str) -> None:
    if name not in PRECISIONS:
        raise SacEdgeError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}")


def refusal(bundle: Bundle, backend: str, precision: str) -> str | None:
    """Why ``backend`` at ``precision`` cannot serve this bundle here (None when it can)."""
    k = kind(backend)
    check_precision(precision)
    reason = k.unavailable()
    if reason is not None:
        return f"backend {backend!r} is unavailable: {reason}"
    if precision not in k.precisions(bundle):
        return f"precision {precision} is not in the bundle for backend {backend!r}"
    return gate_refusal(bundle, precision)


def candidates(
    bundle: Bundle, backends: Sequence[str] | None = None, precisions: Sequence[str] | None = None
) -> list[Candidate]:
    """Every backend x precision asked for (default: all), each with its refusal or None."""
    out = []
    for name in backends or tuple(KINDS):
        for precision in precisions or PRECISIONS:
            out.append(Candidate(name, precision, refusal(bundle, name, precision)))
    return out


def open_backend(bundle: Bundle, backend: str, precision: str, options: BackendOptions | None = None) -> Backend:
    """Open ``backend`` at ``precision``: the one way a backend is opened. A refused combination is a
    one-line SacEdgeError; a precision the kind gates (``BackendKind.gated``) serves only once the engine
    parity gate passed on it (a ParityError otherwise, the backend closed), and every later swap must pass
    it too before it is published."""
    reason = refusal(bundle, backend, precision)
    if reason is not None:
        raise SacEdgeError(reason)
    k = kind(backend)
    opened = k.load(bundle, precision, options or BackendOptions())
    if precision in k.gated:
        try:
            opened.gate_swaps(SwapGate(bundle))
            gate_open(opened, bundle)
        except BaseException:
            opened.close()
            raise
    return opened
