"""A member's side of a run, on its own machine, after the ClientApp's entry
(:mod:`fedamp_flwr.client_app`): its privacy ledger, which model it takes home, and its
models kept in its own ``model-dir``. Nothing here imports the server's side."""
