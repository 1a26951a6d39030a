"""The coordinator's side of a run: the ServerApp's steps after its main
(:mod:`fedamp_flwr.server_app`): the clients and members found, the rounds, their messages
and replies, the run's files (metrics.json, checkpoints, the manifest), the dashboards and
the run page, the warm start, and the members' models delivered. Nothing here runs on a
member's machine."""
