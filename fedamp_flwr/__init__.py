"""Flower app wiring, by side: the ServerApp (``server_app.py``, its steps in ``server/``), the
ClientApp (``client_app.py``, a member's machine in ``member/``), what both share (the
validated run config, members' keys, model cards) and the tools beside a run (``tools/``)."""

import warnings

# Ray's tip at every start of Flower's simulation engine (the simulation process imports this
# package first): about an environment variable of Ray's own that this app does not set.
warnings.filterwarnings("ignore", message="Tip: In future versions of Ray, Ray will no longer "
                        "override accelerator", category=FutureWarning)
