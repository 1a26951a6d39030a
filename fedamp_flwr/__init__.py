"""Flower app wiring: ServerApp, ClientApp and the validated run config."""

import warnings

# Ray's tip at every start of Flower's simulation engine (the simulation process imports this
# package first): about an environment variable of Ray's own that this app does not set.
warnings.filterwarnings("ignore", message="Tip: In future versions of Ray, Ray will no longer "
                        "override accelerator", category=FutureWarning)
