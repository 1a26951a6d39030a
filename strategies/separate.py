"""Separate: every client trains only on its own data (the FedAMP paper's "Separate").

No collaboration at all: each client's model on the server is only ever
replaced by that client's own training result, and each client is tested on
its own model. It is :class:`strategies.core.base.PersonalizedStrategy` with its
default hooks; the server merely keeps the models between rounds (and applies
the scenarios: drop-outs, heterogeneous epochs).
"""

from __future__ import annotations

from .core.base import PersonalizedStrategy
from .core.registry import RunSetup, personal_kwargs, register_strategy
from .core.settings import Settings


class Separate(PersonalizedStrategy):
    """Each client trains and tests its own model; nothing is shared.

    Client contract: plain local training (``local``) of the received own
    model; tested as received. Parameters are those of
    :class:`strategies.core.base.PersonalizedStrategy`.
    """


@register_strategy("separate", keeps_apart=True, federates=False)
def _separate(settings: Settings, run: RunSetup) -> Separate:
    return Separate(**personal_kwargs(run))
